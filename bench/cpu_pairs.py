#!/usr/bin/env python3
"""What one sample costs pyprof, build against build, in turns. This VM's
speed drifts by 10-30 % within a minute, and at 50 kHz so does how much of
the ring pyprof keeps up with, so one run per build (bench/run.py) compares
two builds badly; recordings of one target that alternate between them,
round after round, do not.

Each round records the same running target once per build, in alternating
order, `record --sampler kernel --mode cpu -r RATE -d SECS`; per build the
medians over rounds of: pyprof's CPU time (user + system, start-up
included) per sample, the BPF program's CPU per sample on the target (the
kernel's statistics, from the summary line), the samples per second kept,
and the records lost to a full ring.

    python3 bench/cpu_pairs.py --builds /tmp/pyprof-before,target/release/pyprof
        [--pythons 3.12,3.15] [--depth 100] [--rate 50000] [--secs 3]
        [--rounds 6] [--json FILE]

The target is bench/target.py (cpu, --depth frames deep) on CPU 0, pyprof
on CPU 1 (as bench/run.py pins them). One target per python for all rounds.
"""

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (bench/run.py: interpreters, the target, pinning)

SUMMARY = re.compile(r"(\d+) samples over")
PROGRAM = re.compile(r"BPF program ([\d.]+) ms CPU in \d+ runs.*?, (\d+) on a target.*?(\d+) records.*?(\d+) lost")


def record(build, target, rate, secs, out):
    """One recording: (pyprof CPU µs/sample, BPF µs/sample, samples/s, lost, records)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen([build, "record", "--pid", str(target.pid), "--sampler", "kernel", "--mode", "cpu",
                          "-r", str(rate), "-d", str(secs), "-f", "json", "-o", out],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=bench.die_with_parent(bench.pinned(bench.PROFILER_CPU)))
    try:
        _, err = p.communicate(timeout=secs + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise SystemExit("%s did not end %.0f s after its %s s recording" % (build, 30, secs))
    # communicate() reaped it: its rusage is the children's, taken around it.
    status = p.returncode
    s, k = SUMMARY.search(err), PROGRAM.search(err)
    if status != 0 or not (s and k):
        raise SystemExit("%s failed (status %d): %s" % (build, status, err.strip()))
    samples = int(s.group(1))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu_us = cpu * 1e6 / samples
    bpf_us = float(k.group(1)) * 1e3 / max(int(k.group(2)), 1)
    return cpu_us, bpf_us, samples / secs, int(k.group(4)), int(k.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", required=True, help="comma list of pyprof binaries")
    ap.add_argument("--pythons", default="3.12,3.15")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--rate", type=int, default=50000)
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    builds = args.builds.split(",")
    tmp = bench.make_workdir()
    rows = []
    try:
        for py in bench.find_pythons(args.pythons.split(","), private_proc=False):
            target = bench.Target(py, "cpu", args.depth, tmp, private_proc=False)
            runs = {b: [] for b in builds}
            try:
                for r in range(args.rounds):
                    for b in (builds if r % 2 == 0 else builds[::-1]):
                        got = record(b, target, args.rate, args.secs, os.path.join(tmp["host"], "r.json"))
                        runs[b].append(got)
                        bench.log("%s round %d %s: %.1f µs + BPF %.1f µs a sample, %.0f samples/s, %d records lost, %d read"
                                  % (py.label, r + 1, b, *got))
            finally:
                target.stop()
            for b in builds:
                med = [statistics.median(x[i] for x in runs[b]) for i in range(4)]
                rows.append({"python": py.label, "build": b, "depth": args.depth, "rate": args.rate, "secs": args.secs,
                             "rounds": args.rounds, "cpu_us": med[0], "bpf_us": med[1], "samples_per_s": med[2],
                             "lost": med[3], "runs": runs[b]})
    finally:
        bench.remove_workdir(tmp, keep=False)
    print("| python | build | pyprof CPU µs/sample | BPF µs/sample | samples/s | records lost |")
    print("|---|---|--:|--:|--:|--:|")
    for r in rows:
        print("| %s | %s | %.1f | %.1f | %.0f | %d |" % (r["python"], r["build"], r["cpu_us"], r["bpf_us"], r["samples_per_s"], r["lost"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
