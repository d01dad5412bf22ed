"""Forced collections over many cyclic objects, with the time they take
measured in-process.

Builds 20,000 pairs of objects that point at each other, drops them and
calls gc.collect(), over and over; automatic collection is off, so every
collection is one of those. gc.callbacks time each collection from its
"start" to its "stop" call. Prints "ready" (flushed) first, runs for argv[1]
seconds (default 3), then prints "gc IN_GC TOTAL": seconds spent collecting
and seconds run since "ready". Syntax and library of CPython 3.8 only.
"""
import gc
import sys
import time

clock = time.perf_counter
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
in_gc = 0.0
started = None


def on_gc(phase, info):
    global in_gc, started
    if phase == "start":
        started = clock()
    elif started is not None:
        in_gc += clock() - started
        started = None


class Node(object):
    def __init__(self):
        self.other = None


def build(n):
    keep = []
    for _ in range(n):
        a = Node()
        b = Node()
        a.other = b
        b.other = a
        keep.append(a)
    return keep


def churn(deadline):
    while clock() < deadline:
        garbage = build(20000)
        del garbage
        gc.collect()


gc.disable()
gc.callbacks.append(on_gc)
print("ready", flush=True)
t0 = clock()
churn(t0 + seconds)
print("gc %.6f %.6f" % (in_gc, clock() - t0), flush=True)
