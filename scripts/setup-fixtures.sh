#!/usr/bin/env bash
# Installs every interpreter and tool the test suite runs against, outside the
# repository (in $PYPROF_CACHE, default ~/.cache/pyprof). Idempotent: each step
# checks what is already there, so a second run takes a second.
#
#   - pyenv CPython 3.8-3.13 (shared-library builds with symbols; from the
#     machine image: pyenv cannot download sources here, so we only check)
#   - Debian's own /usr/bin/python3.11 (static, stripped; apt package python3.11)
#   - a Debian sid chroot with python3.13, 3.14, 3.15 (debootstrap)
#   - CPython test suites for Debian's interpreters (libpython3.X-testsuite)
#   - py-spy and austin in a venv, as oracles and benchmark peers
#   - libc6-dbg (names for libc's internal functions in --native stacks)
#   - gdb (its gcore writes the core files `dump --core` tests read)
#   - numpy in a venv of pyenv 3.12 (a real C extension for --native tests)
#   - maturin in a venv, to build the wheel (scripts/build-wheel.sh; tests/wheel.rs)
#   - opentelemetry-proto in a venv, whose own classes read what the agent's
#     --otlp pushes (tests/agent_push.rs)
set -euo pipefail

CACHE="${PYPROF_CACHE:-$HOME/.cache/pyprof}"
mkdir -p "$CACHE"
log() { printf 'setup-fixtures: %s\n' "$*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    log "$1 needs root (apt-get, debootstrap, chroot); run as root"
    exit 1
  fi
}

apt_updated=""
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  need_root "installing ${missing[*]}"
  if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# 1. pyenv interpreters (part of the machine image; 2.7 and 3.7 prove the
#    "unsupported version" error).
PYENV_ROOT="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
for v in 2.7 3.7 3.8 3.9 3.10 3.11 3.12 3.13; do
  if ! ls -d "$PYENV_ROOT"/versions/"$v".*/bin/python"$v" >/dev/null 2>&1; then
    log "pyenv CPython $v is missing under $PYENV_ROOT/versions (pyenv install $v)"
    exit 1
  fi
done

# 2. Debian's static python3.11, and tools the tests use.
apt_install python3.11 debootstrap chromium golang-go libc6-dbg strace tmux gdb
# The kernel sampler's BPF program (scripts/build-bpf.sh; its test checks the
# committed object against the source) and setpriv for its fallback test.
apt_install clang llvm libbpf-dev util-linux

# 3. Debian sid chroot with 3.13-3.15. Built aside and renamed, so an
#    interrupted run never leaves a half chroot that looks complete.
SID="$CACHE/sid"
if [ ! -f "$SID/.pyprof-complete" ]; then
  need_root "debootstrap"
  rm -rf "$SID.partial"
  log "debootstrap sid into $SID (about a minute)"
  debootstrap --variant=minbase --include=python3.13,python3.14,python3.15 sid "$SID.partial" \
    >"$CACHE/debootstrap.log" 2>&1 || {
      log "debootstrap failed; see $CACHE/debootstrap.log"; exit 1; }
  rm -rf "$SID"
  mv "$SID.partial" "$SID"
  touch "$SID/.pyprof-complete"
fi
for v in 3.13 3.14 3.15; do
  [ -x "$SID/usr/bin/python$v" ] || { log "python$v missing in $SID"; exit 1; }
done

# 3b. CPython's own test suites (Lib/test), which bench/accuracy.py runs as
#     real code; the pyenv builds have theirs. Debian splits them out. Note
#     the package pins its interpreter's exact version, so on the host it may
#     upgrade python3.11 to the archive's latest point release.
apt_install libpython3.11-testsuite
sid_missing=()
for v in 3.13 3.14 3.15; do
  chroot "$SID" dpkg -s "libpython$v-testsuite" >/dev/null 2>&1 || sid_missing+=("libpython$v-testsuite")
done
if [ ${#sid_missing[@]} -gt 0 ]; then
  need_root "installing ${sid_missing[*]} in $SID"
  log "apt-get install ${sid_missing[*]} in $SID"
  # The lists debootstrap left match the interpreters it installed; refresh
  # them only if they no longer lead to a download.
  if ! chroot "$SID" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${sid_missing[@]}" >/dev/null 2>&1; then
    chroot "$SID" apt-get update -qq
    chroot "$SID" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${sid_missing[@]}" >/dev/null
  fi
fi

# 4. py-spy and austin, pinned, in their own venv.
TOOLS="$CACHE/tools"
if [ ! -x "$TOOLS/bin/py-spy" ] || [ ! -x "$TOOLS/bin/austin" ]; then
  base_py="$(ls -d "$PYENV_ROOT"/versions/3.11.*/bin/python3.11 | head -n1)"
  "$base_py" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q py-spy==0.4.3 austin-dist==4.0.0
fi

# 4b. numpy, a real C extension from PyPI, for the --native tests; pinned.
NUMPY="$CACHE/numpy-venv"
if [ ! -x "$NUMPY/bin/python" ] || ! "$NUMPY/bin/python" -c 'import numpy' 2>/dev/null; then
  py312="$(ls -d "$PYENV_ROOT"/versions/3.12.*/bin/python3.12 | head -n1)"
  rm -rf "$NUMPY"
  "$py312" -m venv "$NUMPY"
  "$NUMPY/bin/pip" install -q numpy==2.1.3
fi

# 4c. maturin, pinned, for the wheel (the script owns the pin and the venv).
"$(dirname "$0")/build-wheel.sh" --setup

# 4d. opentelemetry-proto, pinned: 1.45.2 is generated from
#     opentelemetry-proto v1.10.0, the profiles v1development messages that
#     src/agent/push/otlp_proto.rs implements. The pin moves with that file.
OTLP="$CACHE/otlp-venv"
OTLP_PROTO=1.45.2
if [ ! -x "$OTLP/bin/python" ] || [ "$("$OTLP/bin/python" -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))' 2>/dev/null)" != "$OTLP_PROTO" ]; then
  py312="$(ls -d "$PYENV_ROOT"/versions/3.12.*/bin/python3.12 | head -n1)"
  rm -rf "$OTLP"
  "$py312" -m venv "$OTLP"
  "$OTLP/bin/pip" install -q "opentelemetry-proto==$OTLP_PROTO"
fi
"$OTLP/bin/python" -c 'from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2' || {
  log "opentelemetry-proto in $OTLP has no profiles v1development"; exit 1; }

# 5. speedscope's file-format schema and ajv-cli to validate pyprof's
#    speedscope output against it; pinned, in $CACHE/npm.
NPM_DIR="$CACHE/npm"
npm_pins=(speedscope@1.25.0 ajv@8.20.0 ajv-cli@5.0.0)
npm_missing=()
for pin in "${npm_pins[@]}"; do
  name="${pin%@*}" version="${pin##*@}"
  have="$(node -p "require(process.argv[1]).version" "$NPM_DIR/node_modules/$name/package.json" 2>/dev/null || true)"
  [ "$have" = "$version" ] || npm_missing+=("$pin")
done
if [ ${#npm_missing[@]} -gt 0 ]; then
  command -v npm >/dev/null || { log "npm is missing (Debian package nodejs)"; exit 1; }
  log "npm install ${npm_missing[*]} into $NPM_DIR"
  npm install --prefix "$NPM_DIR" --save-exact --no-audit --no-fund --loglevel=error "${npm_pins[@]}" >/dev/null
fi
[ -f "$NPM_DIR/node_modules/speedscope/dist/release/file-format-schema.json" ] && [ -x "$NPM_DIR/node_modules/.bin/ajv" ] || {
  log "speedscope schema or ajv-cli missing under $NPM_DIR"; exit 1; }

log "ready: pyenv 3.8-3.13, /usr/bin/python3.11, $SID (3.13-3.15), $TOOLS/bin/{py-spy,austin}, $CACHE/maturin, $OTLP"
