"""Targets for tests/kernel_sampler.rs.

deep N: recurse N frames through `down`, then spin in `leaf` forever.
late:   print "ready", sleep 0.5 s, then start a thread spinning in
        `late_worker` (a thread the recording has not seen at its start).
Prints "ready" (flushed) once the state to look at is reached.
"""
import sys
import threading
import time


def leaf():
    x = 0
    for i in range(1000):
        x += i
    return x


def down(n):
    if n > 1:
        return down(n - 1)
    print("ready", flush=True)
    while True:
        leaf()


def late_worker():
    while True:
        leaf()


if __name__ == "__main__":
    if sys.argv[1] == "deep":
        sys.setrecursionlimit(10000)
        down(int(sys.argv[2]))
    else:
        print("ready", flush=True)
        time.sleep(0.5)
        t = threading.Thread(target=late_worker, name="late-spinner", daemon=True)
        t.start()
        t.join()
