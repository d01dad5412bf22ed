"""Targets for tests/kernel_sampler.rs.

deep N: recurse N frames through `down`, then spin in `leaf` forever.
late:   print "ready", sleep 0.5 s, then start a thread spinning in
        `late_worker` (a thread the recording has not seen at its start).
blink:  a thread that blocks for 2 ms at a time in `nap`, between short
        runs of `leaf` (off CPU most of the time, never for long); the
        main thread waits for it.
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


def nap():
    time.sleep(0.002)


def blinker():
    while True:
        nap()
        leaf()


if __name__ == "__main__":
    if sys.argv[1] == "deep":
        sys.setrecursionlimit(10000)
        down(int(sys.argv[2]))
    elif sys.argv[1] == "blink":
        t = threading.Thread(target=blinker, name="blinker", daemon=True)
        t.start()
        print("ready", flush=True)
        t.join()
    else:
        print("ready", flush=True)
        time.sleep(0.5)
        t = threading.Thread(target=late_worker, name="late-spinner", daemon=True)
        t.start()
        t.join()
