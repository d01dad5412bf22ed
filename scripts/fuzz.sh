#!/usr/bin/env bash
# Runs the fuzz targets (docs/fuzzing.md): each for FUZZ_SECONDS (default
# 300) under nice, growing fuzz/corpus/NAME, then minimises that corpus
# (`cargo fuzz cmin`). Usage: scripts/fuzz.sh [TARGET...] (default: all).
# Needs a nightly toolchain and `cargo install cargo-fuzz`. A crash stops
# its target; the input is left in fuzz/artifacts/NAME/.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${FUZZ_SECONDS:-300}
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//'); fi
# No sanitizer: the library is safe Rust, and twice the executions find more.
cargo +nightly fuzz build -s none || exit 1
mkdir -p logs
for t in "${targets[@]}"; do
  nice -n 15 cargo +nightly fuzz run -s none "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 > "logs/$t.log" 2>&1
  echo "$t: exit $?, $(grep -E '^stat::number_of_executed_units' "logs/$t.log" | awk '{print $2}') executions, $(ls "artifacts/$t" 2>/dev/null | wc -l) artifacts"
  nice -n 15 cargo +nightly fuzz cmin -s none "$t" "corpus/$t" > "logs/$t.cmin.log" 2>&1 || echo "$t: cmin failed (logs/$t.cmin.log)"
done
