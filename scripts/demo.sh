#!/usr/bin/env bash
# Builds pyprof and profiles the bundled example into a flamegraph.
# Uses the first Python 3.8+ found (pyenv's, else the system's).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
py="${PYTHON:-$(command -v python3)}"
out="${1:-demo.svg}"
./target/release/pyprof record --rate 1000 --threads -o "$out" -- "$py" examples/demo.py
echo "open $out in a browser (search with Ctrl-F, click to zoom)"
