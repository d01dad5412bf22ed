#!/usr/bin/env python3
"""Print, from a `cargo test` log, each failed test's panic message under
its test binary, in a few lines: CI shows the end of a long log, where the
messages themselves (printed per binary, mid-log) are no longer in view.

A test binary can also fail with no panic to show (killed by a signal,
aborted, a harness that never reported): for those, the tests it marked
FAILED, why cargo says it failed, and the last lines it printed."""
import re
import sys

MAX_LINES = 6
MAX_CHARS = 600
TAIL_LINES = 8


def digest(lines):
    """The last panic of each failed test (a test over every interpreter
    panics once per failing interpreter, then once listing them all), then
    each failed binary that showed none."""
    binary, test, last, taking = None, None, {}, 0
    sections, failed = {}, []
    for line in lines:
        line = line.rstrip("\n")
        m = re.match(r"\s*Running (\S+)", line)
        if m:
            binary, test, taking = m.group(1), None, 0
            sections[binary] = []
            continue
        if binary is not None:
            sections[binary].append(line)
        if line.startswith("error: test failed"):
            failed.append(binary)
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
    out = [line for msg in last.values() for line in msg]
    with_panic = {b for (b, _) in last}
    for b in failed:
        if b is None or b in with_panic:
            continue
        body = sections[b]
        end = next((i for i, l in enumerate(body) if l.startswith("error: test failed")), len(body))
        tests = [l.strip() for l in body[:end] if l.endswith(" ... FAILED")]
        cause = [l.strip() for l in body if l.startswith("WATCHDOG:")]
        cause += [l.strip() for l in body[end:] if "didn't exit successfully" in l]
        tail = [l for l in body[:end] if l.strip()][-TAIL_LINES:]
        out.append("%s: failed with no panic message; %s" % (b, "; ".join(tests + cause) or "no test marked FAILED"))
        out.extend("    " + l[:MAX_CHARS] for l in tail)
    return out


if __name__ == "__main__":
    with open(sys.argv[1], errors="replace") as f:
        found = digest(f)
    if found:
        print("test.sh: what the failed tests said (their full output is above):")
        print("\n".join(found))
