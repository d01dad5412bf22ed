#![no_main]
// The entry is shared with tests/fuzz_corpora.rs, which replays the corpus.
libfuzzer_sys::fuzz_target!(|data: &[u8]| pyprof::fuzzing::perf_map(data));
