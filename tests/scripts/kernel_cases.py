"""Targets for tests/kernel_sampler.rs.

deep N: recurse N frames through `down`, then spin in `leaf` forever.
late:   print "ready", sleep 0.5 s, then start a thread spinning in
        `late_worker` (a thread the recording has not seen at its start).
mixed N M: N frames alternating `ping` and `pong`, then a generator `gen`
        (whose frame lives in its object, not beside its caller's), M
        frames of `down` called from it, then spin in `leaf`: a chain
        that leaves one page for another and the data stack for the heap.
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


def ping(n, m):
    return pong(n - 1, m) if n > 1 else gen_bottom(m)


def pong(n, m):
    return ping(n - 1, m) if n > 1 else gen_bottom(m)


def gen(m):
    yield down(m)


def gen_bottom(m):
    for _ in gen(m):
        pass


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
    elif sys.argv[1] == "mixed":
        sys.setrecursionlimit(10000)
        ping(int(sys.argv[2]), int(sys.argv[3]))
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
