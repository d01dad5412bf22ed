# Shared by gen.sh and asyncio.sh (sourced, not run): how both scripts
# compile against a CPython's headers and hold the result against DWARF.

# The -D flags CPython was configured with (they change struct layouts:
# Py_DEBUG, Py_TRACE_REFS ...), read from the build's Makefile if there is one.
python_defines() {
    [ -n "$1" ] || return 0
    grep -E '^(CONFIGURE_CPPFLAGS|CONFIGURE_CFLAGS|CONFIGURE_CFLAGS_NODIST|BASECFLAGS|OPT)[ \t]*=' "$1" |
        grep -oE -- '-D_?Py_[A-Za-z0-9_]+(=[A-Za-z0-9_]+)?' | sort -u | tr '\n' ' ' | sed 's/ $//'
}

# dwarf_check EXPECT LIB TMP: every "expression<TAB>value" line of EXPECT
# (what the headers gave) evaluated by gdb in LIB's DWARF. Dies (through the
# caller's `die`) on any mismatch; prints "OK MISSING": how many agreed, and
# how many the DWARF does not know.
dwarf_check() {
    local expect=$1 lib=$2 tmp=$3
    cat > "$tmp/check.py" <<PY
import gdb
ok = bad = missing = 0
for line in open("$expect"):
    expr, want = line.rstrip("\n").split("\t")
    try:
        got = int(gdb.parse_and_eval("(long)(%s)" % expr))
    except gdb.error:
        missing += 1
        continue
    if got == int(want):
        ok += 1
    else:
        bad += 1
        print("MISMATCH %s: headers %s, DWARF %d" % (expr, want, got))
print("RESULT %d %d %d" % (ok, bad, missing))
PY
    gdb -nx -batch -ex "python exec(open('$tmp/check.py').read())" "$lib" > "$tmp/dwarf" 2>/dev/null || true
    grep MISMATCH "$tmp/dwarf" >&2 && die "headers and DWARF of $lib disagree"
    set -- $(sed -n 's/^RESULT //p' "$tmp/dwarf")
    [ $# -eq 3 ] || die "gdb check of $lib did not run"
    [ "$1" -gt 0 ] || die "gdb found none of the types in $lib (no DWARF?)"
    echo "$1 $3"
}
