"""A target whose own work can be checked after a profiler has come and gone.

Three threads add up work units (they contend for the GIL, and push and
pop frames all the time), one wakes every millisecond, the main thread
waits. It counts the SIGTRAP and SIGCONT its handlers see (`--trap ignore`
ignores SIGTRAP instead). On SIGUSR1 every thread finishes its unit and the
main thread prints one JSON line: per thread, the units it did and their
sum, which the checker works out from the count in closed form:
n * (120 * 1000003 * k + 2380) + 120 * 97 * n * (n - 1) / 2.

First stdout line: "ready PID".
"""
import json
import os
import signal
import sys
import threading
import time

# A plain flag, not a threading.Event: the SIGUSR1 handler runs in the main
# thread between two bytecodes, and Event.set() takes the lock that the main
# thread's own Event.wait() may be holding right then. The target then
# deadlocked on itself now and then (two CI runs, one on sid-3.15), with its compute
# threads spinning on.
stopping = False
seen = {"trap": 0, "cont": 0}
results = {}


def leaf(x):
    return 3 * x + 1


def unit(k, i):
    s = 0
    for j in range(40):
        s += leaf(k * 1000003 + i * 97 + j)
    return s


def compute(k):
    total, i = 0, 0
    while not stopping:
        total += unit(k, i)
        i += 1
    results[str(k)] = [i, total]


def waker():
    total, i = 0, 0
    while not stopping:
        time.sleep(0.001)
        total += unit(9, i)
        i += 1
    results["9"] = [i, total]


def stop(signum, frame):
    global stopping
    stopping = True


def count(name):
    def handler(signum, frame):
        seen[name] += 1
        # At once, so a checker can tell which of its actions it followed.
        print(name, seen[name], flush=True)
    return handler


def main():
    if "--trap" in sys.argv and sys.argv[sys.argv.index("--trap") + 1] == "ignore":
        signal.signal(signal.SIGTRAP, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTRAP, count("trap"))
    signal.signal(signal.SIGCONT, count("cont"))
    signal.signal(signal.SIGUSR1, stop)
    threads = [threading.Thread(target=compute, args=(k,), name="compute-%d" % k) for k in (1, 2, 3)]
    threads.append(threading.Thread(target=waker, name="waker"))
    for t in threads:
        t.start()
    print("ready", os.getpid(), flush=True)
    while not stopping:
        time.sleep(0.05)
    for t in threads:
        t.join()
    print(json.dumps({"threads": results, "trap": seen["trap"], "cont": seen["cont"]}), flush=True)


main()
