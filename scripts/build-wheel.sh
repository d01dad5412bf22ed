#!/usr/bin/env bash
# Builds the pyprof wheel (README "Install") with maturin and prints its path
# on stdout. Idempotent and safe to run twice at once: maturin is installed
# from the package index, pinned, into a venv outside the repository
# ($PYPROF_CACHE/maturin, default ~/.cache/pyprof/maturin) on the first run
# and reused after.
#
# The wheel is built from the same `cargo build --release` as everything else
# (same profile, same target directory: $CARGO_TARGET_DIR or target/), so
# after a release build it only relinks the binary stripped (over
# target/release/pyprof; pyproject.toml's `strip = true`) and packs it, in
# seconds; from nothing it is a whole release build (under 3 minutes on 2 cores).
#
#   scripts/build-wheel.sh            # -> target/wheels/pyprof_sampler-VERSION-py3-none-manylinux_2_34_x86_64.whl
#   pip install target/wheels/pyprof_sampler-*.whl
#   scripts/build-wheel.sh --setup    # only install maturin (scripts/setup-fixtures.sh does)
set -euo pipefail
cd "$(dirname "$0")/.."

MATURIN_VERSION=1.16.0
CACHE="${PYPROF_CACHE:-$HOME/.cache/pyprof}"
VENV="$CACHE/maturin"
log() { printf 'build-wheel: %s\n' "$*" >&2; }
mkdir -p "$CACHE"

# One run at a time sets up the venv and builds (tests may run this in parallel).
exec 9>"$CACHE/build-wheel.lock"
flock 9

# The marker is written last: an interrupted install is done again.
if [ ! -f "$VENV/.pyprof-complete" ] || [ "$("$VENV/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN_VERSION" ]; then
  # Any Python 3.8+ can host maturin: $PYTHON, else pyenv's 3.12, else python3.
  py="${PYTHON:-}"
  if [ -z "$py" ]; then
    PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"
    py="$(ls -d "$PYENV_ROOT"/versions/3.12.*/bin/python3.12 2>/dev/null | head -n1 || true)"
    py="${py:-$(command -v python3 || true)}"
  fi
  [ -n "$py" ] || { log "no Python found to install maturin with (set PYTHON=...)"; exit 1; }
  log "installing maturin $MATURIN_VERSION into $VENV (once)"
  rm -rf "$VENV"
  "$py" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "maturin==$MATURIN_VERSION"
  touch "$VENV/.pyprof-complete"
fi

[ "${1:-}" = --setup ] && exit 0

out="${CARGO_TARGET_DIR:-target}/wheels"
mkdir -p "$out"
rm -f "$out"/pyprof_sampler-*.whl
"$VENV/bin/maturin" build --release --locked --out "$out" >&2
ls "$out"/pyprof_sampler-*.whl
