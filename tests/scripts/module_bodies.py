"""Module bodies made afresh and freed as soon as they have run, their
memory taken at once by objects that are not code objects: a sampler that
names a frame's code object after the interrupt finds, for a body that has
returned since, something else at its address.

    python module_bodies.py [SECONDS]

Each round compiles a new body, which calls `spin` for 2 ms, runs it, drops
it and fills the freed blocks with bytes objects of the sizes around it.
First stdout line: "ready".
"""
import sys
import time


def spin(until):
    while time.perf_counter() < until:
        pass


def main():
    end = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
    print("ready", flush=True)
    junk, n = [], 0
    while time.time() < end:
        n += 1
        body = compile("spin(time.perf_counter() + 0.002)\nround_%d = %d\n" % (n, n), "<body %d>" % n, "exec")
        exec(body, {"spin": spin, "time": time})
        del body
        junk = [bytes(k) for k in range(16, 640, 8)]


main()
