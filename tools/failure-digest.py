#!/usr/bin/env python3
"""Print, from a `cargo test` log, each failed test's panic message under
its test binary, in a few lines: CI shows the end of a long log, where the
messages themselves (printed per binary, mid-log) are no longer in view."""
import re
import sys

MAX_LINES = 6
MAX_CHARS = 600


def digest(lines):
    """The last panic of each failed test (a test over every interpreter
    panics once per failing interpreter, then once listing them all)."""
    binary, test, last, taking = None, None, {}, 0
    for line in lines:
        line = line.rstrip("\n")
        m = re.match(r"\s*Running (\S+)", line)
        if m:
            binary = m.group(1)
            continue
        m = re.match(r"---- (\S+) stdout ----", line)
        if m:
            test = m.group(1)
            continue
        if test and "panicked at" in line:
            last[(binary, test)] = ["%s :: %s: %s" % (binary, test, line.strip())]
            taking = MAX_LINES
            continue
        if taking:
            if line.startswith(("stack backtrace:", "note: ", "---- ", "failures:")):
                taking = 0
                continue
            last[(binary, test)].append("    " + line[:MAX_CHARS])
            taking -= 1
    return [line for msg in last.values() for line in msg]


if __name__ == "__main__":
    with open(sys.argv[1], errors="replace") as f:
        found = digest(f)
    if found:
        print("test.sh: what the failed tests said (their full output is above):")
        print("\n".join(found))
