"""Runs short Python children one after another, each through
subprocess (fork, then exec at once), as a test runner or a build does.
Every child works in child_work for a moment, then prints "child PID" to
stderr. argv: how many children, and how long each works (seconds)."""
import subprocess
import sys

CHILD = """import os, sys, time
def child_work():
    end = time.time() + %s
    while time.time() < end:
        pass
child_work()
print("child", os.getpid(), file=sys.stderr)
"""


def parent_wait(n, secs):
    for _ in range(n):
        subprocess.run([sys.executable, "-c", CHILD % secs], check=True)


parent_wait(int(sys.argv[1]), float(sys.argv[2]))
