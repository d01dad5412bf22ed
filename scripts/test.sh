#!/usr/bin/env bash
# The whole test suite, from a fresh machine: fixtures first (idempotent,
# cached outside the repo), then every test against every interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
# tmux, daemons and shells fail in odd ways when /dev/null is a plain file;
# checked again at the end, so a test or tool that replaces it is caught.
dev_null_ok() {
  [ -c /dev/null ] && return 0
  echo "test.sh: /dev/null is not a character device$1; as root: rm -f /dev/null && mknod -m 666 /dev/null c 1 3" >&2
  return 1
}
dev_null_ok ""
scripts/setup-fixtures.sh
# The module graph first: no cycle, none of the arrows docs/architecture.md forbids.
python3 tools/check-imports.py
# Tests append what they could not cover here (tests/common: skipped()).
skips=target/tmp/pyprof-skipped.txt
rm -f "$skips"
# Release build: sampling-rate tests measure a real profiler, not a debug one.
status=0
log=target/tmp/test-output.log
mkdir -p target/tmp
cargo test --release --all-targets --no-fail-fast -- --test-threads="${PYPROF_TEST_THREADS:-2}" 2>&1 | tee "$log" || status=${PIPESTATUS[0]}
# A long log is seen from its end: repeat there what each failure said.
if [ "$status" -ne 0 ]; then
  python3 tools/failure-digest.py "$log" >&2 || true
fi
dev_null_ok " after the tests (one of them replaced it)" || status=1
if [ -s "$skips" ]; then
  echo "test.sh: $(wc -l < "$skips") test cases were SKIPPED and not covered by this run (listed in $skips)" >&2
else
  echo "test.sh: no test case was skipped" >&2
fi
exit "$status"
