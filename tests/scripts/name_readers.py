"""Functions that spend their time taking their own name: each
`f.__name__` takes and drops a reference to the string that is also its code
object's co_name, so that string's reference count moves all the time while
the function runs. 300 functions made by exec, all kept alive, each run for
5 ms in turn, round after round. Prints "ready" once all exist; runs argv[1]
seconds (default 60). Syntax and library of CPython 3.8 only."""
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
SOURCE = """
def reader_%d(until):
    n = 0
    while monotonic() < until:
        for _ in range(50):
            n += len(reader_%d.__name__)
    return n
"""
readers = []
scope = {"monotonic": time.monotonic}
for k in range(300):
    exec(compile(SOURCE % (k, k), "<reader %d>" % k, "exec"), scope)
    readers.append(scope["reader_%d" % k])
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for f in readers:
        f(time.monotonic() + 0.005)
