#!/usr/bin/env python3
"""What a sampler costs a CPU-bound target, in windows that take turns on
one process: its throughput with each sampler against the windows beside
it with none, a round at a time, over many rounds. This VM's speed drifts
by 10-30 % within a minute, so runs minutes apart (bench/run.py's slowdown
column) compare badly; within a round of a few seconds the drift is
common to every window and the median of the rounds' ratios holds still.

Rows beside pyprof's samplers and the peers:
  floor   the interrupts alone: a cpu-clock perf event on every CPU at the
          rate, as the kernel sampler opens, with no program and no ring.
          What any sampler that takes each sample at an interrupt of the
          sampled CPU costs here at the least.
  sleeper bench/sleeper.c on the profilers' CPU, waking at the rate (a
          sampler's timer alone).

    python3 bench/slowdown_pairs.py [--pythons 3.12,3.15] [--rates 1000,10000]
        [--rounds 15] [--window 1.0] [--samplers floor,kernel,ptrace,py-spy]
        [--measure throughput|stolen] [--depth 3] [--json FILE]

A pyprof sampler may name the build to run, to set two side by side:
kernel@/tmp/pyprof-before (default: target/release/pyprof).

--measure stolen: the target is bench/gaps_target.py, which reads the clock
back to back and sums the gaps between reads: the time taken from it (an
interrupt and what runs in it, a stop, the hypervisor), whatever speed the
host lends the VM meanwhile. The figure is that time's rise over the window
beside it, in percent of the target's time: the direct part of a
slowdown, without what the sampler's work does to the target's caches.

Each window runs its sampler from --warmup s before the window to its end
(pyprof's BPF programs load and attach in about 0.3 s). The target is
bench/target.py (cpu, --depth frames deep, 3 by default; --measure stolen:
bench/gaps_target.py, --depth frames deep if given) on CPU 0, the sampler on CPU 1 (as
bench/run.py pins them). Figures: median slowdown over rounds, with the
interquartile range, and what one sample costs the target's CPU: the
slowdown over the rate (per-CPU events fire every 1/rate s of each CPU's
time, so the target keeps 1 - rate x cost of its CPU). At 20-50 kHz that
cost stands far above the noise; at 1 kHz the slowdown it predicts is the
figure to set beside a measured one. The accuracy of the same samplers is
bench/run.py's and tests/accuracy.rs's.
"""

import argparse
import ctypes
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (bench/run.py: interpreters, the target, pinning)

PYPROF = bench.PYPROF
PYSPY = os.path.join(bench.CACHE, "tools", "bin", "py-spy")

# The floor's child: perf_event_open(2) of a software cpu-clock sampling
# event on every CPU, enabled at once, no mmap (samples are counted and
# dropped: the interrupt is all that runs), until killed.
FLOOR = r'''
import ctypes, os, signal, struct, sys, time
rate = float(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
fds = []
for cpu in range(os.cpu_count()):
    attr = bytearray(128)
    # type=SOFTWARE, size, config=CPU_CLOCK, sample_period, sample_type=0, read_format=0, flags=0 (enabled)
    struct.pack_into("IIQQQQQ", attr, 0, 1, 128, 0, int(1e9 / rate), 0, 0, 0)
    fd = libc.syscall(298, (ctypes.c_char * 128).from_buffer(attr), -1, cpu, -1, 0)
    if fd < 0:
        sys.exit("perf_event_open: errno %d" % ctypes.get_errno())
    fds.append(fd)
print("ready", flush=True)
signal.sigwait({signal.SIGTERM, signal.SIGINT})
'''


def start(cmd, cpu):
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=bench.die_with_parent(bench.pinned(cpu)))


def sampler_cmd(name, pid, rate, secs, tmp, sleeper):
    out = os.path.join(tmp, "out")
    if name == "floor":
        return [sys.executable, "-c", FLOOR, str(rate)]
    if name == "sleeper":
        return [sleeper, str(rate), str(secs), out]
    kind, _, build = name.partition("@")
    if kind in ("kernel", "ptrace", "nonblocking"):
        return [build or PYPROF, "record", "--pid", str(pid), "--sampler", kind, "-r", str(rate), "-d", "%.2f" % secs, "-q", "-f", "collapsed", "-o", out + ".txt"]
    if name == "py-spy":
        return [PYSPY, "record", "--pid", str(pid), "-r", str(rate), "-d", str(int(secs + 0.999)), "-f", "raw", "-o", out + ".txt"]
    raise SystemExit("unknown sampler %r" % name)


def window(target, name, rate, args, tmp, sleeper):
    """The target's work units per second over one window with `name`
    sampling it (None: nothing)."""
    proc = None
    if name:
        proc = start(sampler_cmd(name, target.pid, rate, args.warmup + args.window + 0.5, tmp, sleeper), bench.PROFILER_CPU)
        if name == "floor" and proc.stdout.readline().strip() != b"ready":
            raise SystemExit("floor: %s" % proc.stderr.read().decode())
        time.sleep(args.warmup)
    a = target.snapshot()
    time.sleep(args.window)
    b = target.snapshot()
    if args.measure == "stolen":
        kill(proc, name)
        return (b[0] - a[0]) / (b[1] - a[1])
    kill(proc, name)
    return (b[0] - a[0]) / ((b[1] - a[1]) / 1e9)


def kill(proc, name):
    if proc:
        proc.terminate() if name == "floor" else proc.send_signal(2)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pythons", default="3.12,3.15")
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--warmup", type=float, default=0.6)
    ap.add_argument("--samplers", default="floor,kernel,ptrace,py-spy")
    ap.add_argument("--measure", choices=["throughput", "stolen"], default="throughput")
    ap.add_argument("--depth", type=int, help="frames deep the target works (default: 3; --measure stolen: as its loop is)")
    ap.add_argument("--json")
    args = ap.parse_args()
    samplers = [s for s in args.samplers.split(",") if s]
    tmp = bench.make_workdir()
    sleeper = None
    if "sleeper" in samplers:
        sleeper, why = bench.build_sleeper(tmp)
        if not sleeper:
            raise SystemExit(why)
    rows = []
    rng = random.Random(31)
    try:
        for py in bench.find_pythons(args.pythons.split(","), private_proc=False):
            for rate in (int(r) for r in args.rates.split(",")):
                if args.measure == "stolen":
                    target = bench.Target(py, "gaps", 0, tmp, private_proc=False, script_args=[str(args.depth)] if args.depth else [])
                else:
                    target = bench.Target(py, "cpu", args.depth or 3, tmp, private_proc=False)
                try:
                    per = {s: [] for s in samplers}
                    for r in range(args.rounds):
                        # Each round: every sampler once, in a new order, each
                        # beside a window with none right before it.
                        order = samplers[:]
                        rng.shuffle(order)
                        for s in order:
                            base = window(target, None, rate, args, tmp["host"], sleeper)
                            got = window(target, s, rate, args, tmp["host"], sleeper)
                            per[s].append(100 * (got - base) if args.measure == "stolen" else 100 * (1 - got / base))
                        bench.log("%s %d Hz round %d: %s" % (py.label, rate, r + 1, " ".join("%s %.1f" % (s, per[s][-1]) for s in samplers)))
                finally:
                    target.stop()
                for s in samplers:
                    lo, med, hi = quartiles(per[s])
                    rows.append({"python": py.label, "rate": rate, "sampler": s, "slowdown_pct_median": med, "q1": lo, "q3": hi, "rounds": per[s]})
    finally:
        bench.remove_workdir(tmp, keep=False)
    print("| python | rate | sampler | target slowdown, median % | interquartile range | cost per sample, µs |")
    print("|---|--:|---|--:|---|--:|")
    for r in rows:
        r["us_per_sample"] = r["slowdown_pct_median"] / 100 / r["rate"] * 1e6
        print("| %s | %d | %s | %.1f | %.1f to %.1f | %.1f |" % (r["python"], r["rate"], r["sampler"], r["slowdown_pct_median"], r["q1"], r["q3"], r["us_per_sample"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
