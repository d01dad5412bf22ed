#!/bin/sh
# asyncio.sh: print offsets/asyncio/cpython-3.X.toml for one CPython minor:
# what `--async` needs to walk asyncio's task graph (src/offsets/asyncio.rs).
#
# Why two sources: the _asyncio module's structs (TaskObj and the wake-up
# wrappers) are defined inside Modules/_asynciomodule.c, in no header, so
# their layout is taken from the DWARF of the module itself (pyenv builds it
# with -g). Everything else (methods, cells, tuples, lists, sets, weak
# references, coroutines and their frames) is offsetof/sizeof compiled from
# the release's own headers (asyncio.c), like gen.sh does, and proven against
# the DWARF of libpython when gdb and a libpython with DWARF are there.
#
# 3.14+ describe TaskObj in the target itself (the .AsyncioDebug section,
# read at attach): their file carries only the header half, which supplies
# what that section and _Py_DebugOffsets lack (frame-state values, tag bits,
# set entries).
#
# Usage:
#   tools/gen-offsets/asyncio.sh 3.9 > offsets/asyncio/cpython-3.9.toml
#       3.8-3.13: $PYENV_ROOT/versions/3.X.* (newest patch), headers and
#       lib-dynload/_asyncio*.so. 3.14+: Debian's headers under
#       $PYPROF_HDRS/d3.X (see gen.sh for how to unpack them).
# Needs gcc, awk and gdb. Output depends only on those inputs and the notes
# table below (what check-asyncio.py proved against live targets).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
PYPROF_HDRS=${PYPROF_HDRS:-/tmp/pyprof-hdrs}

die() { echo "asyncio.sh: $*" >&2; exit 1; }
. "$here/dwarf.sh"

minor=${1:?usage: asyncio.sh 3.X}
case $minor in 3.[0-9]*) ;; *) die "usage: asyncio.sh 3.X" ;; esac
command -v gdb > /dev/null 2>&1 || die "gdb is needed (DWARF of _asyncio)"

prefix=$(ls -d "$PYENV_ROOT"/versions/"$minor".[0-9]* 2>/dev/null | sort -V | tail -n 1 || true)
mod="" lib=""
if [ -n "$prefix" ] && [ -d "$prefix/include/python$minor/internal" ]; then
    inc=$prefix/include/python$minor
    mod=$(ls "$prefix"/lib/python"$minor"/lib-dynload/_asyncio*.so 2>/dev/null | head -n 1 || true)
    [ -f "$prefix/lib/libpython$minor.so.1.0" ] && lib=$prefix/lib/libpython$minor.so.1.0
    label="pyenv build of CPython"
else
    inc=$PYPROF_HDRS/d$minor/usr/include/python$minor
    label="Debian libpython$minor-dev headers of CPython"
fi
[ -f "$inc/Python.h" ] || die "no Python.h in $inc"
pyver=$(sed -n 's/^#define PY_VERSION[ \t]*"\(.*\)".*/\1/p' "$inc/patchlevel.h")
hex=$(sed -n 's/^#define PY_MINOR_VERSION[ \t]*\([0-9]*\).*/\1/p' "$inc/patchlevel.h")
# Which half comes from where: up to 3.13 TaskObj only exists as DWARF.
if [ "$hex" -le 13 ]; then
    [ -n "$mod" ] || die "no _asyncio*.so under $prefix: 3.$hex needs its DWARF"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The build's own -D switches (see gen.sh: Debian's JIT flags change layouts).
mk=$(ls "$inc"/../../lib/python"$minor"/config-"$minor"*/Makefile 2>/dev/null | head -n 1 || true)
pydefs=$(python_defines "$mk")
gcc -std=gnu11 -O0 -w -DPy_BUILD_CORE $pydefs -I"$inc" -I"$inc/.." "$here/asyncio.c" -o "$tmp/asyncio" ||
    die "compile failed against $inc"
"$tmp/asyncio" > "$tmp/body"

# Headers against the DWARF of libpython: the binary the target runs.
dwarf=""
if [ -n "$lib" ]; then
    "$tmp/asyncio" --gdb > "$tmp/expect"
    counts=$(dwarf_check "$tmp/expect" "$lib" "$tmp") || exit 1
    set -- $counts
    dwarf="all $1 header offsetof/sizeof/enum values equal the DWARF of $(basename "$lib") (gdb)"
    [ "$2" -eq 0 ] || dwarf="$dwarf; $2 not found in DWARF"
fi

# The _asyncio module's structs, from its DWARF. A type or field the
# version does not have is left out; one it must have fails loudly.
if [ -n "$mod" ] && [ "$hex" -le 13 ]; then
    cat > "$tmp/task.py" <<'EOF'
import gdb
def struct(name):
    try:
        return gdb.lookup_type(name).strip_typedefs()
    except gdb.error:
        return None
def fields(t):
    return {f.name: f.bitpos // 8 for f in t.fields()}
def section(title, typename, keys, required):
    t = struct(typename)
    if t is None:
        if required:
            raise SystemExit("no type %s" % typename)
        return
    f = fields(t)
    print("\n[%s]" % title)
    print("size = %d  # sizeof(%s)" % (t.sizeof, typename))
    for key, field, need in keys:
        if field in f:
            print("%s = %d  # %s.%s" % (key, f[field], typename, field))
        elif need:
            raise SystemExit("%s has no %s" % (typename, field))
section("task", "TaskObj", [
    ("coro", "task_coro", True), ("name", "task_name", True),
    ("fut_waiter", "task_fut_waiter", True), ("callback0", "task_callback0", True),
    ("callbacks", "task_callbacks", True)], True)
# <= 3.9: a task wakes its awaiter through this object; 3.10+ through a
# builtin method bound to the task (PyCFunctionObject.m_self).
section("wakeup_wrapper", "TaskWakeupMethWrapper", [("task", "ww_task", True)], False)
section("step_wrapper", "TaskStepMethWrapper", [("task", "sw_task", True)], False)
EOF
    gdb -nx -batch -ex "python exec(open('$tmp/task.py').read())" "$mod" > "$tmp/task" 2> "$tmp/task.err" ||
        die "DWARF of $mod: $(cat "$tmp/task.err")"
    grep -q '^\[task\]' "$tmp/task" || die "DWARF of $mod has no TaskObj: $(cat "$tmp/task.err")"
    tasksrc="TaskObj and the wake-up wrappers from the DWARF of $(basename "$mod") (gdb); "
else
    tasksrc="TaskObj from the target's .AsyncioDebug section at attach (not in this file); "
    : > "$tmp/task"
fi

# What was proven against live targets (tools/gen-offsets/check-asyncio.py,
# run by tests/asyncio_offsets.rs); update when another build is checked.
case $minor in
3.8 | 3.9 | 3.10 | 3.12) seen="$pyver"; live="pyenv $pyver" ;;
3.11) seen="3.11.7 and 3.11.2"; live="pyenv $pyver and Debian 3.11.2 (/usr/bin/python3.11: static, stripped)" ;;
3.13) seen="3.13.0 and 3.13.18"; live="pyenv $pyver and Debian sid 3.13.18" ;;
3.14 | 3.15) seen="$pyver"; live="Debian sid $pyver, TaskObj from its .AsyncioDebug, generators and frames from its _Py_DebugOffsets" ;;
*) seen=""; live="" ;;
esac

cat <<EOF
# Generated by tools/gen-offsets/asyncio.sh: do not edit; regenerate instead.
# asyncio task-graph offsets for $minor, see offsets/README.md.

[provenance]
python = "$pyver"
source = "${tasksrc}the rest offsetof/sizeof compiled from the $label $pyver (include/python$minor), gcc -DPy_BUILD_CORE${pydefs:+ $pydefs}, x86-64"
applies_to = "$minor.x; checked on ${seen:-no build} only (other patch releases not checked)"
regenerate = "tools/gen-offsets/asyncio.sh $minor > offsets/asyncio/cpython-$minor.toml"
EOF
[ -n "$dwarf" ] && echo "verified_dwarf = \"$dwarf\""
[ -n "$live" ] && echo "verified_live = \"tools/gen-offsets/check-asyncio.py inside running $live (tests/asyncio_offsets.rs): a task awaited by one and by two tasks, gather, TaskGroup (3.11+); every offset followed in memory and compared with the objects Python reports\""
if [ "$hex" -ge 14 ]; then
    sed 's/^awaiter_links = "callbacks"/awaiter_links = "awaited_by"/' "$tmp/body"
else
    cat "$tmp/body"
fi
cat "$tmp/task"
