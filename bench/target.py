"""Benchmark target for bench/run.py (Python 3.8+; no imports beyond the stdlib).

    python target.py cpu DEPTH      recurse to DEPTH Python frames, then spin on a
                                    fixed CPU work unit forever
    python target.py memory NSTACKS spin through ~NSTACKS distinct call stacks

Prints "ready" just before the workload starts. On SIGUSR1 it prints one line,
"<units completed> <time.monotonic_ns()>", to stdout; the harness divides the
difference of two such lines to get work units per second. Exits on SIGTERM.
"""
import os
import signal
import sys
import time

count = 0


def report(signum, frame):
    sys.stdout.write("%d %d\n" % (count, time.monotonic_ns()))
    sys.stdout.flush()


def work_unit():
    # A fixed amount of pure-Python CPU work (a few microseconds).
    x = 0
    for i in range(100):
        x += i * i
    return x


def spin():
    global count
    while True:
        work_unit()
        count += 1


def recurse(n):
    if n <= 0:
        spin()
    else:
        recurse(n - 1)


def memory(nstacks):
    # NSTACKS distinct stacks: side x side leaf paths through `side` generated
    # functions, f_a -> f_b -> work, each function defined at its own line.
    global count
    side = max(1, int(round(nstacks ** 0.5)))
    src = []
    for k in range(side):
        src.append(
            "def f%d(depth, b):\n"
            "    if depth:\n"
            "        return fns[b](depth - 1, b)\n"
            "    return work_unit()\n" % k
        )
    ns = {"work_unit": work_unit}
    exec(compile("".join(src), "<generated>", "exec"), ns)
    fns = [ns["f%d" % k] for k in range(side)]
    ns["fns"] = fns
    n = 0
    while True:
        # the stack changes with a changing number: f_a -> f_b -> work_unit
        a, b = n % side, (n // side) % side
        for _ in range(5):
            fns[a](1, b)
            count += 1
        n += 1


def main():
    signal.signal(signal.SIGUSR1, report)
    signal.signal(signal.SIGTERM, lambda s, f: os._exit(0))
    kind, arg = sys.argv[1], int(sys.argv[2])
    if kind not in ("cpu", "memory"):
        sys.exit("unknown workload %r" % kind)
    sys.setrecursionlimit(max(1000, arg + 100))
    print("ready", flush=True)
    return kind, arg


if __name__ == "__main__":
    kind, arg = main()
    # Called from module level so that the Python stack is exactly DEPTH frames:
    # <module>, recurse x (DEPTH - 3), spin, work_unit (DEPTH >= 3).
    if kind == "memory":
        memory(arg)
    elif arg > 3:
        recurse(arg - 4)
    else:
        spin()
