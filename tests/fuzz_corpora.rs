//! The fuzzers (`fuzz/`, docs/fuzzing.md) do not run in CI; their corpora
//! do. Every file of `fuzz/corpus/NAME/` (minimised by `cargo fuzz cmin`,
//! crashes found included) goes through the same entry function the fuzz
//! target `NAME` calls, and none may panic. A target without a corpus, a
//! corpus without a target or a target file calling another entry fails.

use std::path::{Path, PathBuf};

use pyprof::fuzzing::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    out.sort();
    out
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target_calling_its_entry() {
    for (name, _) in TARGETS {
        let source = std::fs::read_to_string(fuzz_dir().join(format!("fuzz_targets/{name}.rs"))).unwrap_or_else(|e| panic!("fuzz target {name}: {e}"));
        assert!(source.contains(&format!("pyprof::fuzzing::{name}(data)")), "fuzz_targets/{name}.rs does not call pyprof::fuzzing::{name}");
        assert!(!files(&fuzz_dir().join("corpus").join(name)).is_empty(), "corpus {name} is empty");
    }
    for dir in files(&fuzz_dir().join("corpus")) {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(TARGETS.iter().any(|(t, _)| *t == name), "corpus {name} has no target in pyprof::fuzzing::TARGETS");
    }
}

#[test]
fn every_corpus_file_goes_through_its_entry_without_a_panic() {
    let (mut inputs, mut bytes) = (0, 0);
    let mut failures = Vec::new();
    for (name, entry) in TARGETS {
        for file in files(&fuzz_dir().join("corpus").join(name)) {
            let data = std::fs::read(&file).unwrap();
            inputs += 1;
            bytes += data.len();
            if std::panic::catch_unwind(|| entry(&data)).is_err() {
                failures.push(format!("{name}: {}", file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} input(s) panicked:\n{}", failures.len(), failures.join("\n"));
    // The committed corpora stay small (docs/fuzzing.md: `cargo fuzz cmin`).
    assert!(bytes < 2 << 20, "{inputs} corpus files hold {bytes} bytes, over 2 MiB");
}
