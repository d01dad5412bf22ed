"""Code objects freed and recreated all the time, so a new one usually takes
a freed one's address (pymalloc hands the last freed block back first).
Each round compiles `f_K` afresh, calls it, and drops it; `f_K` calls
`spin_K`, which lives for the whole run. So in any correct stack the caller
of `spin_K` is `f_K`: a profiler that trusted a cached code object at a
reused address would name the caller after the previous round's function.
Exits by itself after argv[1] seconds (default: never)."""
import sys
import time
import types

deadline = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
ROUNDS = 7


def busy():
    x = 0
    for i in range(3000):
        x += i
    return x


# One long-lived spin_K per K, each its own code object.
for k in range(ROUNDS):
    exec("def spin_%d():\n    return busy()\n" % k)


def template():
    return spin()


def round(i):
    """Make, run and drop f_K; returns the address its code object had."""
    k = i % ROUNDS
    name = "f_%d" % k
    # A copy of template's code under another name: the same size as the
    # last round's, freed just before, so the allocator tends to hand back
    # that very block. (Keyword arguments spelled out: building them as a
    # dict first makes 3.10 hand out a fresh block every round.)
    if sys.version_info >= (3, 11):
        code = template.__code__.replace(co_name=name, co_qualname=name)
    else:
        code = template.__code__.replace(co_name=name)
    f = types.FunctionType(code, {"spin": globals()["spin_%d" % k]})
    del code
    f()
    return id(f.__code__)


def churn():
    # The premise of the test, checked in the target itself: how many of 50
    # rounds put f_K's code object where an earlier round's had been.
    seen = set()
    reused = 0
    for i in range(50):
        a = round(i)
        reused += a in seen
        seen.add(a)
    print("ready reused=%d" % reused, flush=True)
    i = 0
    while time.time() < deadline:
        round(i)
        i += 1


churn()
