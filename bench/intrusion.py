#!/usr/bin/env python3
"""Does a profiler that stops the target move what it measures? py-spy's
pausing mode is the exact reference of the short-call tests, and pyprof's
ptrace sampler stops the target too. Each stop cools the target's caches
and predictors, and that can change the split of its time.

The kernel sampler stops nothing, so it can watch the same process while
another profiler samples it: one tests/scripts/short_calls.py target per
python, recorded by pyprof's kernel sampler in turns alone and beside each
profiler of --beside (in a shuffled order per round) over the same
seconds. Reported, per profiler beside, as means with their standard
error over the rounds:

  moved    the kernel sampler's shares with that profiler beside it minus
           its shares alone: what that profiler's stops do to the split.
  apart    that profiler's shares minus the kernel sampler's over the same
           seconds of the same process: how the two instruments differ on
           one workload, whatever the split.

    python3 bench/intrusion.py [--pythons 3.12,3.15] [--rate 1000]
        [--beside py-spy,ptrace-1000,ptrace-10000] [--secs 3] [--rounds 6]
        [--json FILE]

`py-spy` is py-spy in its default, pausing mode at --rate; `ptrace-N` is
pyprof `--sampler ptrace` at N Hz. The target runs on CPU 0, the
profilers on CPU 1 (as bench/run.py pins them). The kernel sampler records
`--sampler kernel --mode cpu` at --rate (the target never leaves its CPU of
its own accord, so every sample is an interrupt's).
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
    """The kernel sampler's shares over `secs`, and those of the profiler
    `beside` (None: none) over the same seconds."""
    out = os.path.join(tmp["host"], tag)
    pin = bench.die_with_parent(bench.pinned(bench.PROFILER_CPU))
    procs = [subprocess.Popen([bench.PYPROF, "record", "-q", "--pid", str(target.pid), "--sampler", "kernel", "--mode", "cpu",
                               "-r", str(rate), "-d", str(secs), "-f", "json", "-o", out + ".json"],
                              stdin=subprocess.DEVNULL, preexec_fn=pin)]
    if beside == "py-spy":
        procs.append(subprocess.Popen([PYSPY, "record", "--pid", str(target.pid), "-r", str(rate), "-d", str(int(secs)), "-f", "raw",
                                       "-o", out + ".txt"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, preexec_fn=pin))
    elif beside:
        procs.append(subprocess.Popen([bench.PYPROF, "record", "-q", "--pid", str(target.pid), "--sampler", "ptrace",
                                       "-r", beside.split("-")[1], "-d", str(secs), "-f", "json", "-o", out + ".beside.json"],
                                      stdin=subprocess.DEVNULL, preexec_fn=pin))
    for p in procs:
        if p.wait(timeout=secs + 60) != 0:
            raise SystemExit("%s exited %d" % (p.args[0], p.returncode))
    ours = shares(accuracy.parse_pyprof_json(out + ".json")[0])
    if beside == "py-spy":
        return ours, shares(accuracy.drop_shims(accuracy.parse_collapsed(out + ".txt")))
    if beside:
        return ours, shares(accuracy.parse_pyprof_json(out + ".beside.json")[0])
    return ours, None


def mean_se(xs):
    return statistics.mean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pythons", default="3.12,3.15")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--beside", default="py-spy", help="comma-separated: py-spy, ptrace-N (N Hz)")
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    others = args.beside.split(",")
    for o in others:
        if o != "py-spy" and not (o.startswith("ptrace-") and o[7:].isdigit()):
            raise SystemExit("--beside: %r is neither py-spy nor ptrace-N" % o)
    tmp = bench.make_workdir()
    rng = random.Random(7)
    rows = []
    try:
        for py in bench.find_pythons(args.pythons.split(","), private_proc=False):
            target = bench.Target(py, "short_calls", 0, tmp, private_proc=False)
            alone_all = []
            got_all = {o: {"kernel": [], "beside": []} for o in others}
            try:
                for r in range(args.rounds):
                    order = [None] + others
                    rng.shuffle(order)
                    got = {o: record(target, args.rate, args.secs, tmp, "r%d-%s" % (r, o or "alone"), o) for o in order}
                    alone_all.append(got[None][0])
                    for o in others:
                        got_all[o]["kernel"].append(got[o][0])
                        got_all[o]["beside"].append(got[o][1])
                    bench.log("%s round %d: kernel sampler alone %s; %s" % (py.label, r + 1, "/".join("%.1f" % got[None][0][f] for f in FUNCS), "; ".join(
                        "beside %s %s, which read %s" % (o, *("/".join("%.1f" % s[f] for f in FUNCS) for s in got[o])) for o in others)))
            finally:
                target.stop()
            for o in others:
                ks, bs = got_all[o]["kernel"], got_all[o]["beside"]
                row = {"python": py.label, "rate": args.rate, "secs": args.secs, "rounds": args.rounds, "beside": o,
                       "kernel_alone": alone_all, "kernel_beside": ks, "beside_read": bs}
                for f in FUNCS:
                    row["moved_" + f] = mean_se([k[f] - a[f] for k, a in zip(ks, alone_all)])
                    row["apart_" + f] = mean_se([b[f] - k[f] for b, k in zip(bs, ks)])
                rows.append(row)
    finally:
        bench.remove_workdir(tmp, keep=False)
    print("| python | beside | moved loop / g / f, pp (mean ± se) | apart loop / g / f, pp (mean ± se) |")
    print("|---|---|---|---|")
    for r in rows:
        fmt = lambda k: " / ".join("%+.2f ± %.2f" % r[k + "_" + f] for f in FUNCS)  # noqa: E731
        print("| %s | %s | %s | %s |" % (r["python"], r["beside"], fmt("moved"), fmt("apart")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
