"""Many-threads target for `bench/run.py --scale` (Python 3.8+, stdlib only).

    python threads_target.py N [BUSY]

N threads in all, the main thread counted: BUSY of them (default 1, the main
thread first) spin in a few Python frames, the rest are blocked a few frames
deep, half in time.sleep and half on a lock nobody releases, because real
services block both ways and a sampler may read the two differently. Prints
"ready" once every thread has reached where it stays, so the first tick
already sees all N. Exits on SIGTERM.
"""
import os
import signal
import sys
import threading
import time

parked = threading.Semaphore(0)
never = threading.Lock()
never.acquire()


def work_unit():
    x = 0
    for i in range(100):
        x += i * i
    return x


def spin():
    while True:
        work_unit()


def busy():
    spin()


def sleep_leaf():
    parked.release()
    time.sleep(1e6)


def lock_leaf():
    parked.release()
    never.acquire()


def blocked(i):
    # three Python frames: blocked -> middle -> *_leaf
    middle(sleep_leaf if i % 2 else lock_leaf)


def middle(leaf):
    leaf()


def main():
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
    n = int(sys.argv[1])
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    # Small stacks: 1000 threads x the default 8 MiB is only address space,
    # but keep the target's RSS and mappings modest anyway.
    threading.stack_size(256 * 1024)
    others = []
    for i in range(1, n):
        target = (lambda: busy()) if i < k else (lambda i=i: blocked(i))
        t = threading.Thread(target=target, name="t%d" % i, daemon=True)
        t.start()
        others.append(t)
    for i in range(n - max(k, 1)):
        parked.acquire()
    print("ready", flush=True)
    if k >= 1:
        busy()
    else:
        blocked(0)


if __name__ == "__main__":
    main()
