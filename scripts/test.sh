#!/usr/bin/env bash
# The whole test suite, from a fresh machine: fixtures first (idempotent,
# cached outside the repo), then every test against every interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-fixtures.sh
# Release build: sampling-rate tests measure a real profiler, not a debug one.
cargo test --release --all-targets --no-fail-fast -- --test-threads="${PYPROF_TEST_THREADS:-2}"
