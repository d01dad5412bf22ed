#!/usr/bin/env python3
"""--async side by side: what task-aware sampling costs and how true it is.

Target: tests/scripts/async_tasks.py (two worker tasks that take turns
spinning 20 ms and 10 ms slices, each awaited through gather or a TaskGroup,
plus a sleeping task). Its own clock (SIGUSR1) says what share of the two
workers' spin time was worker-a's: the exact answer a task-aware profiler's
samples must give.

Profilers, each attached for SECS at RATE: pyprof --async with each of its
samplers (kernel: the graph copied by the eBPF program at the interrupt;
ptrace: read while the GIL holder is stopped), pyprof without it (the cost
of plain stacks), Tachyon --async-aware (CPython 3.15's own sampler, with
and without --blocking; 3.15 only), and py-spy (no task stacks: cost only).
Columns: samples, profiler CPU per sample (user+sys of the profiler
process), worker-a's share by the samples and by the clock, the difference,
and what sampling cost the target: the BPF program's CPU per sample (kernel
sampler), or the share of the time the GIL holder was held (ptrace).

  python3 bench/asyncio.py [--pythons 3.12,3.15] [--rate 1000] [--secs 5]

Needs the fixtures of scripts/setup-fixtures.sh and a release build.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "tests", "scripts", "async_tasks.py")
PYPROF = os.path.join(ROOT, "target", "release", "pyprof")
CACHE = os.environ.get("PYPROF_CACHE", os.path.expanduser("~/.cache/pyprof"))
SID = os.path.join(CACHE, "sid")
PYSPY = os.path.join(CACHE, "tools", "bin", "py-spy")
PYENV = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))


class Target:
    """async_tasks.py on a pyenv interpreter, or in the sid chroot in a mount
    namespace of its own with /proc mounted inside (so Tachyon, run chrooted,
    can join it)."""

    def __init__(self, minor):
        self.chroot = minor >= 14
        if self.chroot:
            shutil.copy(SCRIPT, os.path.join(SID, "tmp", "async_tasks.py"))
            cmd = ["unshare", "-m", "sh", "-c", 'mount -t proc proc "$0/proc" && exec chroot "$0" python3.%d /tmp/async_tasks.py' % minor, SID]
        else:
            exe = sorted(p for p in os.listdir(os.path.join(PYENV, "versions")) if p.startswith("3.%d." % minor))[-1]
            cmd = [os.path.join(PYENV, "versions", exe, "bin", "python3.%d" % minor), SCRIPT]
        self.proc = subprocess.Popen(["nice", "-n", "-20"] + cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("target %s did not start" % cmd)
        # The pid of the interpreter itself (nice, unshare and sh exec into it).
        self.pid = self.proc.pid

    def split(self):
        os.kill(self.pid, 10)  # SIGUSR1
        while True:
            line = self.proc.stdout.readline()
            if line.startswith("split "):
                a, b = line.split()[1:3]
                return float(a), float(b)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def run(cmd):
    """(wall seconds, profiler cpu seconds, merged output) of one profiler run."""
    t0 = time.monotonic()
    p = subprocess.Popen(["nice", "-n", "-20"] + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("%s failed: %s" % (cmd, out[-500:]))
    return time.monotonic() - t0, ru.ru_utime + ru.ru_stime, out


def task_counts(path, task_of):
    """Samples per innermost task, from a collapsed file."""
    counts = {}
    with open(path, errors="replace") as f:
        for line in f:
            text, n = line.rstrip("\n").rsplit(" ", 1)
            tasks = [t for t in (task_of(fr) for fr in text.split(";")) if t]
            if tasks:
                counts[tasks[-1]] = counts.get(tasks[-1], 0) + int(n)
    return counts


def pyprof_task(frame):
    return frame[len("task "):] if frame.startswith("task ") else None


def tachyon_task(frame):
    return frame.split(":")[1] if frame.startswith("<task>:") else None


def profilers(minor, rate, secs, work):
    out = os.path.join(work, "out.txt")
    for sampler in ("kernel", "ptrace"):
        cmd = [PYPROF, "record", "--async", "--sampler", sampler, "-r", str(rate), "-d", str(secs), "-f", "collapsed", "-o", out, "--pid"]
        yield "pyprof --async (%s)" % sampler, cmd, out, pyprof_task
    yield "pyprof (plain, kernel)", [PYPROF, "record", "--sampler", "kernel", "-r", str(rate), "-d", str(secs), "-f", "collapsed", "-o", out, "--pid"], out, None
    if minor == 15:
        inner = "/tmp/tachyon-out.txt"
        for extra in ([], ["--blocking"]):
            name = "tachyon --async-aware" + (" --blocking" if extra else "")
            cmd = ["python3.15", "-m", "profiling.sampling", "attach", "--async-aware", "-r", str(rate), "-d", str(secs), "--collapsed", "-o", inner] + extra
            yield name, ("tachyon", cmd), os.path.join(SID, inner.lstrip("/")), tachyon_task
    if os.path.exists(PYSPY):
        yield "py-spy (no tasks)", [PYSPY, "record", "-r", str(rate), "-d", str(secs), "-f", "raw", "-o", out, "--pid"], out, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pythons", default="3.12,3.15")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--secs", type=int, default=5)
    args = ap.parse_args()
    work = os.path.join(ROOT, "target", "bench-asyncio")
    os.makedirs(work, exist_ok=True)
    rows = []
    for v in args.pythons.split(","):
        minor = int(v.split(".")[1])
        for name, cmd, out, task_of in profilers(minor, args.rate, args.secs, work):
            target = Target(minor)
            try:
                if isinstance(cmd, tuple):
                    cmd = ["nsenter", "-t", str(target.pid), "-m", "--", "chroot", SID] + cmd[1] + [str(target.pid)]
                else:
                    cmd = cmd + [str(target.pid)]
                before = target.split()
                wall, cpu, log = run(cmd)
                after = target.split()
            finally:
                target.stop()
            da, db = after[0] - before[0], after[1] - before[1]
            clock = 100 * da / (da + db)
            counts = task_counts(out, task_of) if task_of else {}
            with open(out, errors="replace") as f:
                samples = sum(int(l.rsplit(" ", 1)[1]) for l in f if l.strip())
            a, b = counts.get("worker-a", 0), counts.get("worker-b", 0)
            share = 100 * a / (a + b) if a + b else None
            held = re.search(r"([\d.]+) % of the time held", log)
            bpf = re.search(r"BPF program ([\d.]+) ms CPU", log)
            cost = ("held %s %%" % held.group(1)) if held else ("BPF %.1f µs/sample" % (1e3 * float(bpf.group(1)) / max(samples, 1)) if bpf else "")
            rows.append((v, name, samples, 1e6 * cpu / max(samples, 1), share, clock, cost))
            print("%s %-32s %6d samples  %7.1f us/sample  worker-a %s vs clock %.2f %%  %s" %
                  (v, name, samples, rows[-1][3], "%.2f %%" % share if share is not None else "n/a", clock, rows[-1][6]), flush=True)
    print("\n| python | profiler | samples | CPU µs/sample | worker-a share | clock | off by pp | sampling's cost to the target |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for v, name, samples, us, share, clock, held in rows:
        off = "%.2f" % (share - clock) if share is not None else "no task stacks"
        print("| %s | %s | %d | %.1f | %s | %.2f | %s | %s |" % (v, name, samples, us, "%.2f" % share if share is not None else "–", clock, off, held))


if __name__ == "__main__":
    sys.exit(main())
