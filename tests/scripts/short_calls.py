"""Two sub-microsecond calls in a tight loop: `t += f(g(p))` in `loop`.

A sampler that is biased against short calls under-reports `g` and `f`
(the leaf shares caller/g/f are what bench/accuracy.py compares with
py-spy's, which stops the target for each sample and so is exact).

Prints "ready" (flushed) when the loop starts, then runs until killed, or
for argv[1] seconds if given. Works on CPython 3.8 and later.
"""
import sys
import time


def g(x):
    return x + 1


def f(x):
    return x * 2


def loop(secs):
    p = 1
    deadline = None if secs is None else time.perf_counter() + secs
    print("ready", flush=True)
    while True:
        # The clock is read once per 10000 calls of f and g, so the caller's
        # own share is the loop and the call overhead, nothing else.
        t = 0
        for _ in range(10000):
            t += f(g(p))
        if deadline is not None and time.perf_counter() >= deadline:
            return t


if __name__ == "__main__":
    loop(float(sys.argv[1]) if len(sys.argv) > 1 else None)
