"""A program that execs itself once: `before_exec` spins SECS, then the
process execs the same interpreter on this script, whose `after_exec`
spins SECS in the new image. Usage: execs_itself.py SECS [sleep]; with
`sleep` the exec is of `sleep 60` instead, a program that is not Python."""

import os
import sys
import time


def spin(secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        pass


def before_exec(secs):
    spin(secs)


def after_exec(secs):
    spin(secs)


if __name__ == "__main__":
    secs = float(sys.argv[1])
    if sys.argv[2:] == ["after"]:
        after_exec(secs)
    else:
        print("ready", flush=True)
        before_exec(secs)
        if sys.argv[2:] == ["sleep"]:
            os.execvp("sleep", ["sleep", "60"])
        os.execv(sys.executable, [sys.executable, __file__, sys.argv[1], "after"])
