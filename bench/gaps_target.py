"""bench/slowdown_pairs.py --measure stolen: a loop that reads the clock back
to back and adds up every gap between two reads longer than THRESHOLD_NS:
the time something else took from it (an interrupt and what runs in it, a
BPF program, a ptrace stop, the hypervisor). Unlike a throughput, the sum
does not move when the host runs the whole VM slower for a while.

With an argument DEPTH, the loop runs DEPTH Python frames deep (a deep
stack costs a sampler that copies it more per sample).

Prints "ready"; on SIGUSR1 one line "<gap ns so far> <time.monotonic_ns()>",
the two numbers bench/target.py prints, so the same harness reads both.
Exits on SIGTERM. Python 3.8+, stdlib only.
"""
import os
import signal
import sys
import time

THRESHOLD_NS = 1500

stolen = 0


def report(signum, frame):
    sys.stdout.write("%d %d\n" % (stolen, time.monotonic_ns()))
    sys.stdout.flush()


def probe():
    global stolen
    now = time.perf_counter_ns
    last = now()
    while True:
        t = now()
        if t - last > THRESHOLD_NS:
            stolen += t - last
        last = t


def start():
    print("ready", flush=True)
    probe()


def down(n):
    return down(n - 1) if n > 1 else start()


def main():
    signal.signal(signal.SIGUSR1, report)
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
    depth = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if depth:
        sys.setrecursionlimit(depth + 100)
        down(depth)
    else:
        start()


main()
