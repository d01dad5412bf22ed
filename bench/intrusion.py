#!/usr/bin/env python3
"""Does the reference move what it measures? py-spy's pausing mode is the
exact reference of the short-call tests, and pyprof's kernel sampler reads
loop's share of tests/scripts/short_calls.py 0.3-2.9 pp under it. Either
pyprof is off, or py-spy's stops change the split of the target's time.

The kernel sampler stops nothing, so it can watch the same process while
py-spy samples it: one short_calls.py target per python, recorded in turns
by pyprof alone and by pyprof with py-spy (its default, pausing mode)
sampling at the same rate over the same seconds. Reported, per round, as
means with their standard error over the rounds:

  moved    pyprof's shares with py-spy beside it minus pyprof's alone: what
           py-spy's stops do to the target's split (0 if nothing).
  apart    py-spy's shares minus pyprof's over the same seconds of the same
           process: how the two instruments differ on one workload.

    python3 bench/intrusion.py [--pythons 3.12,3.15] [--rate 1000]
        [--secs 3] [--rounds 6] [--json FILE]

The target runs on CPU 0, both profilers on CPU 1 (as bench/run.py pins
them). pyprof records `--sampler kernel --mode cpu` (the target never leaves
its CPU of its own accord, so every sample is an interrupt's).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (bench/run.py: interpreters, the target, pinning)
import accuracy  # noqa: E402  (bench/accuracy.py: the stack parsers)

FUNCS = accuracy.SHORT_CALL_FUNCS
PYSPY = os.path.join(bench.TOOLS, "py-spy")


def shares(stacks):
    s, _ = bench.short_call_shares(stacks)
    if s is None:
        raise SystemExit("no stacks")
    return s


def record(target, rate, secs, tmp, tag, beside):
    """pyprof's shares over `secs`, and py-spy's over the same seconds when `beside`."""
    out = os.path.join(tmp["host"], tag)
    procs = [subprocess.Popen([bench.PYPROF, "record", "-q", "--pid", str(target.pid), "--sampler", "kernel", "--mode", "cpu",
                               "-r", str(rate), "-d", str(secs), "-f", "json", "-o", out + ".json"],
                              stdin=subprocess.DEVNULL, preexec_fn=bench.die_with_parent(bench.pinned(bench.PROFILER_CPU)))]
    if beside:
        procs.append(subprocess.Popen([PYSPY, "record", "--pid", str(target.pid), "-r", str(rate), "-d", str(secs), "-f", "raw",
                                       "-o", out + ".txt"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, preexec_fn=bench.die_with_parent(bench.pinned(bench.PROFILER_CPU))))
    for p in procs:
        if p.wait(timeout=secs + 60) != 0:
            raise SystemExit("%s exited %d" % (p.args[0], p.returncode))
    ours = shares(accuracy.parse_pyprof_json(out + ".json")[0])
    theirs = shares(accuracy.drop_shims(accuracy.parse_collapsed(out + ".txt"))) if beside else None
    return ours, theirs


def mean_se(xs):
    return statistics.mean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pythons", default="3.12,3.15")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = bench.make_workdir()
    rng = random.Random(7)
    rows = []
    try:
        for py in bench.find_pythons(args.pythons.split(","), private_proc=False):
            target = bench.Target(py, "short_calls", 0, tmp, private_proc=False)
            moved = {f: [] for f in FUNCS}
            apart = {f: [] for f in FUNCS}
            alone_all, beside_all, pyspy_all = [], [], []
            try:
                for r in range(args.rounds):
                    order = [False, True]
                    rng.shuffle(order)
                    got = {}
                    for beside in order:
                        got[beside] = record(target, args.rate, args.secs, tmp, "r%d%s" % (r, "b" if beside else "a"), beside)
                    alone, (with_spy, spy) = got[False][0], got[True]
                    alone_all.append(alone)
                    beside_all.append(with_spy)
                    pyspy_all.append(spy)
                    for f in FUNCS:
                        moved[f].append(with_spy[f] - alone[f])
                        apart[f].append(spy[f] - with_spy[f])
                    bench.log("%s round %d: pyprof alone %s, beside py-spy %s, py-spy %s" % (
                        py.label, r + 1, *("/".join("%.1f" % s[f] for f in FUNCS) for s in (alone, with_spy, spy))))
            finally:
                target.stop()
            row = {"python": py.label, "rate": args.rate, "secs": args.secs, "rounds": args.rounds,
                   "pyprof_alone": alone_all, "pyprof_beside_pyspy": beside_all, "pyspy": pyspy_all}
            for f in FUNCS:
                row["moved_" + f] = mean_se(moved[f])
                row["apart_" + f] = mean_se(apart[f])
            rows.append(row)
    finally:
        bench.remove_workdir(tmp, keep=False)
    print("| python | moved loop / g / f, pp (mean ± se) | apart loop / g / f, pp (mean ± se) |")
    print("|---|---|---|")
    for r in rows:
        fmt = lambda k: " / ".join("%+.2f ± %.2f" % r[k + "_" + f] for f in FUNCS)  # noqa: E731
        print("| %s | %s | %s |" % (r["python"], fmt("moved"), fmt("apart")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
