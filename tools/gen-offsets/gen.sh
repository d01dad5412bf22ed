#!/bin/sh
# gen.sh: print offsets/cpython-3.X.toml for one CPython minor, computed from
# that release's own internal headers (see offsets/README.md for the schema).
#
# Why: pyprof reads CPython's structs out of another process, so it needs their
# exact layout.  offsetof()/sizeof() over the real headers, compiled with
# -DPy_BUILD_CORE (the internal pycore_*.h refuse to compile without it), is the
# only source that gets bitfields, #ifdefs and padding right.  For 3.13+ the
# target carries _Py_DebugOffsets itself; then we emit its field order (parsed
# from the header here, proven word by word by offsets.c) plus the few offsets
# it lacks.
#
# Usage:
#   tools/gen-offsets/gen.sh 3.9 > offsets/cpython-3.9.toml
#       headers from $PYENV_ROOT/versions/3.9.* (newest patch; pyenv installs
#       include/python3.9/internal) and, if gdb is installed, every number is
#       cross-checked against the DWARF of that build's libpython3.9.so.1.0.
#       Without a pyenv build, falls back to $PYPROF_HDRS/d3.X/usr/include/python3.X
#       (default PYPROF_HDRS=/tmp/pyprof-hdrs), made with e.g.
#         apt-get download libpython3.15-dev && dpkg -x libpython3.15-dev_*.deb /tmp/pyprof-hdrs/d3.15
#   tools/gen-offsets/gen.sh INCLUDE_DIR [LIBPYTHON_WITH_DWARF] > out.toml
#       any build: INCLUDE_DIR is the dir holding Python.h and internal/.
#
# Needs gcc and awk; gdb only for the DWARF check.  Output depends only on the
# headers (and the notes table below), so re-running it is idempotent.  The
# checks against live processes (tools/gen-offsets/check-live.py) are not run
# here; their results are recorded by hand in the notes table.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
PYPROF_HDRS=${PYPROF_HDRS:-/tmp/pyprof-hdrs}

die() { echo "gen.sh: $*" >&2; exit 1; }
. "$here/dwarf.sh"

arg=${1:?usage: gen.sh 3.X | INCLUDE_DIR [LIBPYTHON]}
lib=${2:-}
case $arg in
3.[0-9]*)
    minor=$arg
    # newest installed patch release of that minor
    prefix=$(ls -d "$PYENV_ROOT"/versions/"$minor".[0-9]* 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$prefix" ] && [ -d "$prefix/include/python$minor/internal" ]; then
        inc=$prefix/include/python$minor
        [ -z "$lib" ] && [ -f "$prefix/lib/libpython$minor.so.1.0" ] && lib=$prefix/lib/libpython$minor.so.1.0
    else
        inc=$PYPROF_HDRS/d$minor/usr/include/python$minor
    fi
    regen="tools/gen-offsets/gen.sh $minor"
    ;;
*)  inc=$arg; regen="tools/gen-offsets/gen.sh $arg${lib:+ $lib}" ;;
esac
[ -f "$inc/Python.h" ] || die "no Python.h in $inc"

pyver=$(sed -n 's/^#define PY_VERSION[ \t]*"\(.*\)".*/\1/p' "$inc/patchlevel.h")
minor=$(echo "$pyver" | cut -d. -f1,2)
case $inc in
*/.pyenv/versions/*) label="pyenv build of CPython $pyver (include/python$minor)" ;;
*/usr/include/python*) label="Debian libpython$minor-dev headers of CPython $pyver" ;;
*) label="CPython $pyver headers in $inc" ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/debug_fields.h"
: > "$tmp/debug_init.h"

# 3.13+: flatten struct _Py_DebugOffsets from its header into
# F("section.field", section.field) lines, in declaration order.  Anything but
# `char cookie[8]`, `uint64_t x;` and (possibly anonymous) nested structs makes
# this fail loudly: a new kind of member needs a human decision.
dbg_hdr=$(grep -l 'typedef struct _Py_DebugOffsets' "$inc"/internal/*.h 2>/dev/null | head -n 1 || true)
if [ -n "$dbg_hdr" ]; then
    awk '
    /typedef struct _Py_DebugOffsets[ \t]*\{/ { on = 1; next }
    !on { next }
    /^\}[ \t]*_Py_DebugOffsets;/ { on = 0; next }
    {
        line = $0; sub(/\/\/.*/, "", line)
        if (line ~ /^[ \t]*$/) next
        if (line ~ /^[ \t]*char[ \t]+cookie\[8\]/) next
        if (line ~ /^[ \t]*struct[ \t]*[A-Za-z0-9_]*[ \t]*\{[ \t]*$/) { start[++depth] = n; next }
        if (line ~ /^[ \t]*\}[ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*;[ \t]*$/) {
            name = line; gsub(/[ \t};]/, "", name)
            for (i = start[depth]; i < n; i++) f[i] = name "." f[i]
            depth--; next
        }
        if (line ~ /^[ \t]*uint64_t[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*;[ \t]*$/) {
            x = line; sub(/^[ \t]*uint64_t[ \t]+/, "", x); sub(/[ \t]*;.*/, "", x)
            f[n++] = x; next
        }
        print "gen.sh: cannot flatten _Py_DebugOffsets line: " $0 > "/dev/stderr"; bad = 1
    }
    END { for (i = 0; i < n; i++) printf "F(\"%s\", %s)\n", f[i], f[i]; exit bad }
    ' "$dbg_hdr" > "$tmp/debug_fields.h" || die "flattening $dbg_hdr failed"

    # 3.13 has no standalone _Py_DebugOffsets_INIT: lift the `.debug_offsets = {...}`
    # block out of _PyRuntimeState_INIT so offsets.c can print the expected values.
    if ! grep -q 'define _Py_DebugOffsets_INIT' "$inc"/internal/*.h; then
        awk '
        !on && /\.debug_offsets = \{/ { on = 1; print "#define PYPROF_DEBUG_OFFSETS_INIT_(debug_cookie) { \\"; d = 1; next }
        on {
            o = gsub(/\{/, "{"); c = gsub(/\}/, "}"); d += o - c
            if (d == 0) { print "}"; print "#define PYPROF_DEBUG_OFFSETS_INIT PYPROF_DEBUG_OFFSETS_INIT_(_Py_Debug_Cookie)"; exit }
            print
        }' "$inc/internal/pycore_runtime_init.h" > "$tmp/debug_init.h"
        grep -q 'PYPROF_DEBUG_OFFSETS_INIT ' "$tmp/debug_init.h" || die "no .debug_offsets initialiser found"
    fi
fi

# Layout-changing switches that are not in pyconfig.h but in the build's CFLAGS,
# e.g. Debian 3.14/3.15 build with --enable-experimental-jit=yes-off, i.e.
# -D_Py_TIER2=3 -D_Py_JIT, which adds a field to _PyThreadStateImpl and so
# grows PyInterpreterState and _PyRuntimeState.  The Makefile of the build
# ships next to the headers (pyenv, and Debian's libpython3.X-dev).
mk=$(ls "$inc"/../../lib/python"$minor"/config-"$minor"*/Makefile 2>/dev/null | head -n 1 || true)
pydefs=$(python_defines "$mk")
[ -n "$mk" ] || echo "gen.sh: warning: no config-$minor*/Makefile next to $inc; build CFLAGS unknown" >&2

# -I$inc/..: Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>.
# gnu11: offsets.c uses _Generic and a statement expression.
gcc -std=gnu11 -O0 -w -DPy_BUILD_CORE $pydefs -I"$inc" -I"$inc/.." -I"$tmp" \
    "$here/offsets.c" -o "$tmp/offsets" || die "compile failed against $inc"
"$tmp/offsets" > "$tmp/body" || die "offsets.c self-check failed"

# Cross-check every offsetof/sizeof (and enum) against DWARF: the headers we
# compiled must describe the binary that pyprof will actually read.
dwarf=""
if [ -n "$lib" ] && command -v gdb > /dev/null 2>&1; then
    "$tmp/offsets" --gdb > "$tmp/expect"
    counts=$(dwarf_check "$tmp/expect" "$lib" "$tmp") || exit 1
    set -- $counts
    dwarf="all $1 offsetof/sizeof/enum values above equal the DWARF of $(basename "$lib") (gdb)"
    [ "$2" -eq 0 ] || dwarf="$dwarf; $2 not found in DWARF"
fi

# Which patch releases each file is known to fit, and what was checked by hand
# (tools/gen-offsets/check-live.py against running interpreters).  Update these
# when another build is verified.
case $minor in
3.8 ) applies="3.8.x; verified on 3.8.18 only (other patch releases not checked)"
      live="live: running pyenv 3.8.18, walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.9 ) applies="3.9.x; verified on 3.9.18 only (other patch releases not checked)"
      live="live: running pyenv 3.9.18, walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.10) applies="3.10.x; verified on 3.10.13 only (other patch releases not checked)"
      live="live: running pyenv 3.10.13, walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.11) applies="3.11.x; verified on 3.11.7 (pyenv) and 3.11.2 (Debian 12 /usr/bin/python3.11)"
      live="live: running pyenv 3.11.7 and Debian 3.11.2 (non-PIE, stripped, libpython linked in; found via the _PyRuntime dynsym, whose st_size 166688 = runtime_state.size), walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.12) applies="3.12.x; verified on 3.12.1 only (other patch releases not checked)"
      live="live: running pyenv 3.12.1, walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.13) applies="3.13.x; word order and values of _Py_DebugOffsets identical in 3.13.0 (pyenv) and 3.13.18 (Debian) except the sizes of runtime_state, interpreter_state and thread_state (3.13.x appended PyThreadState.datastack_cached_chunk)"
      live="live: running pyenv 3.13.0 (72/72 debug words equal these headers) and Debian 3.13.18 python3.13 (69/72, the 3 sizes), walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.14) applies="3.14.x; verified on Debian 3.14.10"
      live="live: running Debian 3.14.10 python3.14 (94/94 debug words equal these headers), walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
3.15) applies="3.15.x; verified on Debian 3.15.2"
      live="live: running Debian 3.15.2 python3.15 (110/110 debug words equal these headers, given the JIT -D flags), walked threads, frames, co_qualname, GIL holder, Thread._name of every thread in threading._active, the GC flag and every thread's exception state with check-live.py" ;;
*)    applies="$minor.x (unverified)"; live="" ;;
esac

cat <<EOF
# Generated by tools/gen-offsets/gen.sh: do not edit; regenerate instead.
# CPython struct offsets for $minor, see offsets/README.md.

[provenance]
python = "$pyver"
source = "offsetof/sizeof compiled from the $label, gcc -DPy_BUILD_CORE${pydefs:+ $pydefs}, x86-64"
applies_to = "$applies"
regenerate = "$regen > offsets/cpython-$minor.toml"
EOF
[ -n "$dwarf" ] && echo "verified_dwarf = \"$dwarf\""
[ -n "$live" ] && echo "verified_live = \"$live\""
cat "$tmp/body"
