"""Wall-clock time split exactly in half between two kinds of work.

Time is cut into fixed 20 ms slices (slice k ends at start + (k+1)*0.02 by
time.perf_counter, so slices never drift). Even slices run `long_loop`, one
function doing plain arithmetic with no Python calls; odd slices run
`short_calls`, which makes many short Python calls, some of them entered
from C (map, sorted(key=...), a class's __init__ and __add__ called by the
interpreter's C code), and a stack 6 frames deeper that grows and shrinks.
Both run DEPTH (40) frames down, as code under a test runner does. The
ground truth is that `long_loop` is on the stack (inclusive share) for 50 %
of the wall-clock time. A sampler that drops the reads the short-call
slices' changing stack tears reports more than 50 %. (Misattributing short
callees to their callers does not move this share: see short_calls.py.)

Prints "ready" (flushed) at the start, then runs until killed, or for
argv[1] seconds if given. On SIGUSR1 it prints "split LONG SHORT", the
seconds spent so far in each kind of slice (see report_split). Syntax and library of CPython 3.8 only.
"""
import signal
import sys
import time

SLICE = 0.02
DEPTH = 40
clock = time.perf_counter


def long_loop(deadline):
    # One frame for the whole slice: a counter loop without range() or any
    # Python call; the clock (a C function) is read every 256 iterations.
    x = 1
    while True:
        i = 0
        while i < 256:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            i += 1
        if clock() >= deadline:
            return x


def square(x):
    return x * x


def neg(x):
    return -x


def add3(a, b, c):
    return a + b + c


class Vec(object):
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        return Vec(self.v + other.v)


def down(n):
    # A stack that grows and shrinks 6 frames deep, every other level
    # entered from C (map): the kind of churn that tears a sampler's reads.
    if n >= 6:
        return 0
    if n % 2:
        return down(n + 1) + 1
    return sum(map(down, (n + 1,))) + 1


def short_calls(deadline):
    data = list(range(16))
    total = 0
    while clock() < deadline:
        total += sum(map(square, data))            # Python calls from C (map)
        total += sorted(data, key=neg)[0]          # key function called from C
        total += (Vec(1) + Vec(2)).v               # __init__, __add__ from C
        total += add3(1, 2, 3) + add3(4, 5, 6)     # plain Python-to-Python calls
        total += down(0)                           # a deeper stack that churns
    return total


def below(n, secs):
    # Run the slices under DEPTH frames, as code under a test runner or a
    # framework runs: a deeper stack takes longer to read, so a stack that
    # changes on top tears more reads.
    if n:
        return below(n - 1, secs)
    return slices(secs)


# (seconds in long_loop, seconds in short_calls, the one running or None,
# when it started): replaced whole, so the signal handler reads it whole.
split = (0.0, 0.0, None, 0.0)


def report_split(signum, frame):
    # SIGUSR1: print "split LONG SHORT", the seconds spent so far in each
    # kind of slice, the running one included. A slice that overruns its
    # deadline (the process was not scheduled) counts its whole wall time, so
    # the difference of two reports is the true split between them even on a
    # loaded machine, where the fixed deadlines alone do not make it 50 %.
    long_s, short_s, running, since = split
    if running is not None:
        elapsed = clock() - since
        if running == 0:
            long_s += elapsed
        else:
            short_s += elapsed
    sys.stdout.write("split %.6f %.6f\n" % (long_s, short_s))
    sys.stdout.flush()


def slices(secs):
    global split
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, report_split)
    start = clock()
    print("ready", flush=True)
    long_s = short_s = 0.0
    k = 0
    while secs is None or clock() - start < secs:
        deadline = start + (k + 1) * SLICE
        t0 = clock()
        split = (long_s, short_s, k % 2, t0)
        if k % 2 == 0:
            long_loop(deadline)
            long_s += clock() - t0
        else:
            short_calls(deadline)
            short_s += clock() - t0
        split = (long_s, short_s, None, clock())
        k += 1


if __name__ == "__main__":
    below(DEPTH, float(sys.argv[1]) if len(sys.argv) > 1 else None)
