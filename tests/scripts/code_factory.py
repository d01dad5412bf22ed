"""Compiles a new function every millisecond and runs it until the next one:
every code object (and its name string) is new, as in a program that keeps
generating code (templates, exec, eval). Prints "ready", runs argv[1] seconds."""
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
print("ready", flush=True)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    n += 1
    scope = {}
    source = "def generated_%d(until):\n    while monotonic() < until:\n        pass\n" % n
    exec(compile(source, "<generated %d>" % n, "exec"), {"monotonic": time.monotonic}, scope)
    scope["generated_%d" % n](time.monotonic() + 0.001)
