#!/usr/bin/env python3
"""Accuracy when the profiler's own CPU is taken from it (a busy host).

tests/scripts/time_slices.py (long_loop's share is 50 % by the target's own
clock) runs pinned to CPU 0; pyprof records it from CPU 1, where a
SCHED_FIFO hog takes BURN ms of the CPU about every PERIOD ms, as a host's
steal or a noisy neighbour does. Each sampler takes turns; each row says
long_loop's share against the target's split over the same seconds, and
that split's own distance from 50 % (how much the profiler disturbed it:
a stalled profiler that holds the target stopped freezes it where it is).

Needs root (SCHED_FIFO, the kernel sampler), `cargo build --release`, and
scripts/setup-fixtures.sh for the sid chroot (3.15).

    bench/stolen_cpu.py [--python 3.12|3.15] [--runs 6] [--burn 30]
                        [--period 150] [--rate 1000] [--samplers ptrace,kernel]
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("PYPROF_CACHE") or os.path.expanduser("~/.cache/pyprof")
PYENV_ROOT = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
SCRIPT = os.path.join(ROOT, "tests", "scripts", "time_slices.py")

HOG = """
import random, sys, time
burn, period = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < burn:
        pass
    time.sleep(period * random.uniform(0.5, 1.5))
"""


def target_argv(py):
    if py == "3.15":
        sid = os.path.join(CACHE, "sid")
        inner = os.path.join(sid, "tmp", "pyprof-bench")
        os.makedirs(inner, exist_ok=True)
        shutil.copy(SCRIPT, inner)
        return ["chroot", sid, "/usr/bin/python3.15", "/tmp/pyprof-bench/time_slices.py"]
    versions = os.path.join(PYENV_ROOT, "versions")
    found = sorted(d for d in os.listdir(versions) if d.startswith(py + "."))
    if not found:
        sys.exit("stolen_cpu: no pyenv %s under %s" % (py, versions))
    return [os.path.join(versions, found[-1], "bin", "python" + py), SCRIPT]


def split(target):
    target.send_signal(signal.SIGUSR1)
    for line in target.stdout:
        if line.startswith("split "):
            return tuple(float(x) for x in line.split()[1:3])
    sys.exit("stolen_cpu: the target exited")


def one(args, sampler, out):
    hog = None
    if args.burn > 0:
        hog = subprocess.Popen(["chrt", "-f", "50", "taskset", "-c", "1", sys.executable, "-c", HOG, str(args.burn), str(args.period)])
    target = subprocess.Popen(["taskset", "-c", "0"] + target_argv(args.python), stdout=subprocess.PIPE, text=True)
    try:
        target.stdout.readline()
        before = split(target)
        cmd = ["taskset", "-c", "1", args.pyprof, "record", "--pid", str(target.pid), "--sampler", sampler,
               "-r", str(args.rate), "-d", str(args.seconds), "-q", "-o", out]
        subprocess.run(cmd, check=True)
        after = split(target)
    finally:
        target.kill()
        if hog:
            hog.kill()
    long_s, short_s = after[0] - before[0], after[1] - before[1]
    truth = 100 * long_s / (long_s + short_s)
    p = json.load(open(out))
    hit = total = 0
    for s in p["stacks"]:
        total += s["count"]
        if any(p["frames"][i]["function"] == "long_loop" for i in s["frames"]):
            hit += s["count"]
    share = 100 * hit / max(total, 1)
    return {"sampler": sampler, "share": share, "truth": truth, "samples": total,
            "skipped": p["meta"]["errors"].get("skipped_ticks", 0), "method": p["meta"]["sampling"]["method"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="3.12")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--burn", type=float, default=30.0, help="ms the hog takes at a time (0: no hog)")
    ap.add_argument("--period", type=float, default=150.0, help="ms between the hog's turns, on average")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--samplers", default="ptrace,kernel")
    ap.add_argument("--pyprof", default=os.path.join(ROOT, "target", "release", "pyprof"))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for sampler in args.samplers.split(","):
                r = one(args, sampler, os.path.join(tmp, sampler + ".json"))
                rows.append(r)
                print("%-7s (%s) long_loop %.2f %%, its clock %.2f %%: %+.2f pp; %d samples, %d ticks skipped"
                      % (sampler, r["method"], r["share"], r["truth"], r["share"] - r["truth"], r["samples"], r["skipped"]), flush=True)
    for sampler in args.samplers.split(","):
        mine = [r for r in rows if r["sampler"] == sampler]
        err = [r["share"] - r["truth"] for r in mine]
        moved = [abs(r["truth"] - 50) for r in mine]
        print("%s: error rms %.2f pp, worst %.2f; the target's split moved up to %.2f pp from 50 %%"
              % (sampler, math.sqrt(sum(e * e for e in err) / len(err)), max(map(abs, err)), max(moved)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
