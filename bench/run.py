#!/usr/bin/env python3
"""pyprof vs py-spy vs Austin (vs Tachyon on 3.15), side by side, in one run.

    python3 bench/run.py                 # full matrix, ~5 s per measurement
    python3 bench/run.py --quick         # 2 s per measurement
    python3 bench/run.py --memory        # pyprof memory scenario only (see --memory-secs)
    python3 bench/run.py --accuracy-only # the accuracy scenario only (2-3 min per python)
    python3 bench/run.py --scale         # many threads, and a pre-fork server (only; ~8 min)

Builds nothing: it needs target/release/pyprof (`cargo build --release`), and
py-spy / Austin / the sid chroot from scripts/setup-fixtures.sh (under
$PYPROF_CACHE, default ~/.cache/pyprof). Missing peers are skipped with a note.

Rows: pyprof (exact: the GIL holder held still for each read) and
pyprof --nonblocking (never stops the target; stacks that moved under the read
are counted under "[stack moved while read]"), py-spy --nonblocking and py-spy
(its default, ptrace-stops the target for each sample), Austin, and on 3.15
Tachyon and tachyon --blocking (stops every thread for each sample).

Accuracy scenario (the "share error pp" column; after each python's cost rows,
or alone with --accuracy-only; --no-accuracy leaves it out): one
tests/scripts/short_calls.py process (`t += f(g(p))` in `loop`, two calls well
under a microsecond) per python, recorded in turn by py-spy's default mode at
1 kHz (the reference: each of its samples is one instant), then by every
profiler at every requested rate, then by py-spy at 1 kHz again. The reference
shares are the mean of the two py-spy runs; their gap (the largest difference
of the three shares) is printed as the noise floor. A row's share error is the
largest |share - reference| of the leaf-function shares loop, g and f, in
percentage points, where a share is the % of ALL the tool's samples whose
innermost frame is that function: a torn sample ("[stack moved while read]"),
an empty or an unreadable stack counts as none of the three, i.e. lowers the
shares the way it would mislead a user. The 1000000 Hz rows are measured back
to back too (not copied from 10 kHz). Stacks come from each tool's own output:
pyprof's JSON; py-spy's raw output (collapsed stacks); Austin 4's binary MOJO,
decoded by read_mojo below (Austin 4 has no text output), counted per stack
event like the others' samples (the time-weighted shares are in the JSON);
Tachyon's --collapsed output. The sleeper control takes no stacks, so its
column is "-", as is that of a tool that failed (Austin cannot attach to 3.15:
"Cannot determine the version of the Python interpreter").

Scale scenarios (--scale, only them; see scale() below and docs/performance.md
"Many threads, many processes"): bench/threads_target.py with 1, 10, 100, 1000
threads (one spinning) under pyprof wall/cpu/gil and py-spy, and
bench/prefork_target.py (16 workers, one replaced a second) under
--subprocesses; written to bench/results/scale.json.

Prints one aligned table (and the accuracy scenario's own table, with every
share and the reference per python) and writes the same rows as JSON to
bench/results/latest.json (memory scenario: bench/results/memory.json;
--accuracy-only: bench/results/latest-accuracy.json). docs/performance.md
explains every column and how it is measured.
"""
import argparse
import collections
import ctypes
import datetime
import glob
import json
import math
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # no bench/__pycache__ left in the work tree
import accuracy  # noqa: E402  (bench/accuracy.py: the stack parsers and share helpers)

from children import die_with_parent

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
PYPROF = os.path.join(REPO, "target", "release", "pyprof")
TARGET_SCRIPT = os.path.join(BENCH, "target.py")
SHORT_CALLS = os.path.join(REPO, "tests", "scripts", "short_calls.py")
CACHE = os.environ.get("PYPROF_CACHE") or os.path.expanduser("~/.cache/pyprof")
TOOLS = os.path.join(CACHE, "tools", "bin")
SID = os.path.join(CACHE, "sid")
PYENV_ROOT = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
CLK_TCK = os.sysconf("SC_CLK_TCK")

WINDOW = 0.5        # seconds per target-throughput window
SETTLE = 0.75       # ignore the first SETTLE s after launching a profiler (attach, startup)
# With two CPUs or more the target runs on TARGET_CPU and every profiler (and
# run.py, whose floors must be timed where the profilers run) on PROFILER_CPU,
# so the slowdown column measures what the profiler does to the target, not
# two processes sharing one CPU. --no-pin turns this off.
TARGET_CPU, PROFILER_CPU = 0, 1
PIN = [os.cpu_count() and os.cpu_count() >= 2]


def pinned(cpu):
    """A preexec_fn that pins the child to one CPU (None when pinning is off)."""
    if not PIN[0]:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})
BASE_WINDOWS = 3    # unprofiled windows between two profiler runs


def log(msg):
    sys.stderr.write("bench: %s\n" % msg)
    sys.stderr.flush()


# --------------------------------------------------------------------------- targets


def collapsed_samples(path):
    """Total count in a collapsed-stacks file ("frame;frame;... count" lines)."""
    samples = 0
    with open(path) as f:
        for line in f:
            line = line.rstrip()
            if line:
                samples += int(line.rsplit(" ", 1)[1])
    return samples

class Python:
    """One interpreter: how to launch a script under it."""

    def __init__(self, label, exe, chroot=False):
        self.label, self.exe, self.chroot = label, exe, chroot


def find_pythons(wanted, private_proc):
    found = []
    for label in wanted:
        if label == "3.15":
            exe = os.path.join(SID, "usr", "bin", "python3.15")
            if os.path.exists(exe) and os.geteuid() == 0:
                found.append(Python("3.15", "python3.15", chroot=True))
            else:
                log("skipping 3.15: needs root and %s (scripts/setup-fixtures.sh)" % exe)
            continue
        if label == "static-3.11":
            # Debian's own interpreter: static and stripped, the odd one out.
            if os.path.exists("/usr/bin/python3.11"):
                found.append(Python(label, "/usr/bin/python3.11"))
            else:
                log("skipping static-3.11: no /usr/bin/python3.11")
            continue
        hits = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", label + ".*", "bin", "python" + label)))
        if hits:
            found.append(Python(label, hits[-1]))
        else:
            log("skipping %s: no pyenv interpreter under %s/versions" % (label, PYENV_ROOT))
    return found


class Target:
    """A running bench/target.py (kind "cpu" or "memory"), or with kind
    "short_calls" tests/scripts/short_calls.py (the accuracy scenario; it
    answers no SIGUSR1, so never call snapshot() on it).
    snapshot() -> (work units done, monotonic ns)."""

    def __init__(self, py, kind, arg, workdir, private_proc, script_args=None):
        self.py = py
        self.private_proc = False
        script, script_args = (SHORT_CALLS, []) if kind == "short_calls" else \
            (os.path.join(BENCH, kind + "_target.py"), script_args) if kind in ("threads", "prefork", "gaps") else \
            (TARGET_SCRIPT, [kind, str(arg)])
        if py.chroot:
            # The script lives inside the chroot. With private_proc the target runs in
            # its own mount namespace where /proc is mounted inside the chroot, so that
            # Tachyon (which runs chrooted) can join it with nsenter and read /proc;
            # the host (and every other user of the chroot) sees no mount.
            inner = os.path.join(workdir["chroot_inner"], os.path.basename(script))
            shutil.copy(script, os.path.join(SID, inner.lstrip("/")))
            if private_proc:
                self.private_proc = True
                cmd = ["unshare", "-m", "sh", "-c",
                       'mount -t proc proc "$0/proc" && exec chroot "$0" python3.15 "$@"',
                       SID, inner] + script_args
            else:
                cmd = ["chroot", SID, "python3.15", inner] + script_args
        else:
            cmd = [py.exe, script] + script_args
        self.cmd = cmd
        self.lines = queue.Queue()
        self.stderr = open(os.path.join(workdir["host"], "target-%s-%s-%s.err" % (py.label, kind, arg)), "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr, cwd=workdir["host"], preexec_fn=die_with_parent(pinned(TARGET_CPU)))
        self.pid = self.proc.pid
        threading.Thread(target=self._read, daemon=True).start()
        try:
            first = self.lines.get(timeout=20)
        except queue.Empty:
            first = None
        if first != "ready":
            self.stop()
            raise RuntimeError("target %s did not start (%r); see %s" % (cmd, first, self.stderr.name))

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().strip())

    def snapshot(self):
        # Any reply is a valid (count, time) pair, so a delayed or lost signal (a
        # ptrace-stopped target can lose one) only changes the window length.
        while True:
            try:
                self.lines.get_nowait()
            except queue.Empty:
                break
        for _ in range(10):
            if self.proc.poll() is not None:
                raise RuntimeError("target %d exited (%s)" % (self.pid, self.proc.returncode))
            os.kill(self.pid, signal.SIGUSR1)
            try:
                count, t_ns = self.lines.get(timeout=1.0).split()
                return int(count), int(t_ns)
            except queue.Empty:
                continue
        raise RuntimeError("target %d does not answer SIGUSR1" % self.pid)

    def windows(self, n):
        rates = []
        a = self.snapshot()
        for _ in range(n):
            time.sleep(WINDOW)
            b = self.snapshot()
            rates.append(rate_between(a, b))
            a = b
        return rates

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def rate_between(a, b):
    return (b[0] - a[0]) / ((b[1] - a[1]) / 1e9)


# --------------------------------------------------------------------------- profilers

# --------------------------------------------------------------------------- floors

class IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(IOVec), ctypes.c_ulong,
                                   ctypes.POINTER(IOVec), ctypes.c_ulong, ctypes.c_ulong]


def readv_floor_us(pid, n=20000):
    """CPU µs of one 64-byte process_vm_readv from the target (the cost every
    sampler pays per read), less the cost of an empty ctypes call."""
    addr = None
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            rng, perms = line.split()[:2]
            if perms.startswith("r"):
                addr = int(rng.split("-")[0], 16)
                break
    buf = ctypes.create_string_buffer(64)
    local, remote = IOVec(ctypes.cast(buf, ctypes.c_void_p), 64), IOVec(addr, 64)
    read, empty = _libc.process_vm_readv, _libc.getppid
    t0 = time.thread_time()
    for _ in range(n):
        if read(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != 64:
            return float("nan")
    t1 = time.thread_time()
    for _ in range(n):
        empty()
    t2 = time.thread_time()
    return max(0.0, ((t1 - t0) - (t2 - t1)) / n * 1e6)


class Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def wake_floor_us(hz=10000, n=10000):
    """CPU µs of one timed sleep-and-wake at `hz` (absolute clock_nanosleep, as
    a sampler between ticks does), less the loop's own cost: what a sleeping
    sampler pays per sample before it reads anything."""
    libc = _libc
    libc.prctl(16, 1)  # PR_SET_TIMERSLACK 1 ns, as pyprof does
    step = 10 ** 9 // hz

    def loop(sleep):
        t = Timespec()
        libc.clock_gettime(1, ctypes.byref(t))
        c0 = time.thread_time()
        for _ in range(n):
            t.nsec += step
            if t.nsec >= 10 ** 9:
                t.sec += 1
                t.nsec -= 10 ** 9
            if sleep:
                libc.clock_nanosleep(1, 1, ctypes.byref(t), None)
            else:
                libc.clock_gettime(1, ctypes.byref(Timespec()))
        return time.thread_time() - c0
    return max(0.0, (loop(True) - loop(False)) / n * 1e6)


class Profiler:
    """name; supports(py, rate); command(...) -> argv; parse(...) -> dict(samples, seconds, notes)."""

    name = ""
    has_stacks = True   # stacks(out, run) -> Counter of stacks for the accuracy scenario

    def supports(self, py, rate):
        return True


class PyProf(Profiler):
    exe = PYPROF   # replaced by a private copy for the run (see snapshot_pyprof)

    def __init__(self, native=False, nonblocking=False, kernel=False):
        self.native, self.nonblocking, self.kernel = native, nonblocking, kernel
        self.name = ("pyprof --native --sampler kernel" if native and kernel else "pyprof --native" if native
                     else "pyprof --nonblocking" if nonblocking else "pyprof --sampler kernel" if kernel else "pyprof")

    def command(self, target, rate, secs, out):
        # -v: the diagnostics after the summary report reads per tick and,
        # with --native, how many stacks were merged.
        cmd = [PyProf.exe, "record", "-v", "--pid", str(target.pid), "-r", str(rate), "-d", str(secs),
               "-o", out["host"] + ".json"]
        # The kernel sampler (eBPF at the interrupt) samples on-CPU threads:
        # --mode cpu, which for the spinning targets here is every sample.
        # Its program's CPU time is charged to the interrupted thread, the
        # target, so it shows in the slowdown column, not in pyprof's CPU.
        kernel = ["--sampler", "kernel", "--mode", "cpu"] if self.kernel else ["--sampler", "ptrace"]
        return cmd + kernel + (["--native"] if self.native else []) + (["--nonblocking"] if self.nonblocking else [])

    def parse(self, out, run):
        with open(out["host"] + ".json") as f:
            meta = json.load(f)["meta"]
        res = {"samples": meta["samples"], "seconds": meta["duration_secs"],
               "late": meta.get("late"), "errors": meta.get("errors") or {}}
        reads = re.search(r"([\d.]+) reads/tick", run["log"])
        if reads:
            res["syscalls_per_sample"] = float(reads.group(1))
        m = re.search(r"native: \d+ stacks, ([\d.]+)% merged", run["log"])
        if m:
            res["merged_pct"] = float(m.group(1))
        # How the snapshots were taken and how long the target was held:
        # the profile's meta.sampling (pause_us is the mean over the
        # snapshots that held a thread).
        s = meta.get("sampling") or {}
        if s.get("stopped"):
            res.update({"held_snapshots": s["stopped"],
                        "snapshots": s["stopped"] + s.get("gil_free", 0) + s.get("off_cpu", 0),
                        "pause_us": s["paused_us_total"] / s["stopped"], "pause_max_us": s["paused_us_max"]})
        if s.get("lock_free"):
            res["torn"] = s.get("torn", 0)
            if meta["samples"]:
                res["torn_pct"] = 100.0 * res["torn"] / meta["samples"]
        # The kernel sampler's program runs on the target's CPU, in its time:
        # what it cost per sample, beside pyprof's own CPU.
        k = s.get("kernel") or {}
        if k.get("program_ns") and meta["samples"]:
            res["bpf_us_per_sample"] = k["program_ns"] / 1e3 / meta["samples"]
        if s:
            res["sampling"] = s
        return res

    def stacks(self, out, run):
        # The torn samples are Python-kind frames named "[stack moved while read]",
        # so they stay in, as leaves that are not loop/g/f.
        return accuracy.parse_pyprof_json(out["host"] + ".json")[0]


class PySpy(Profiler):
    def __init__(self, blocking, native=False):
        self.blocking = blocking
        self.native = native
        self.name = "py-spy --native" if native else "py-spy" if blocking else "py-spy --nonblocking"
        self.exe = os.path.join(TOOLS, "py-spy")

    def command(self, target, rate, secs, out):
        cmd = [self.exe, "record", "--pid", str(target.pid), "-r", str(rate), "-d", str(secs),
               "-f", "raw", "-o", out["host"] + ".txt"]
        if not self.blocking:
            cmd.insert(2, "--nonblocking")
        if self.native:
            cmd.insert(2, "--native")   # py-spy's --native always pauses the target
        return cmd

    def parse(self, out, run):
        # raw = collapsed stacks, "frame;frame;... count". py-spy samples until it has
        # taken rate x duration samples, however late, so the wall time is not -d but
        # from its "Sampling process ..." line (printed as its sampler thread starts,
        # after attaching) to its exit.
        samples = collapsed_samples(out["host"] + ".txt")
        m = re.search(r"Samples: (\d+) Errors: (\d+)", run["log"])
        errors = {"errors": int(m.group(2))} if m and int(m.group(2)) else {}
        notes = []
        behind = re.findall(r"([\d.]+)s behind in sampling", run["log"])
        if behind:
            notes.append("%ss behind" % behind[-1])
        start = run["first_line"]("Sampling process") or run["t0"]
        return {"samples": samples, "seconds": run["t_exit"] - start, "errors": errors, "notes": notes,
                "startup_secs": round(start - run["t0"], 3)}

    def stacks(self, out, run):
        # raw frames are "function (file:line)", root first; py-spy 0.4.3 shows
        # CPython 3.13+'s "__init__" trampoline frame, which is never a leaf here.
        return accuracy.drop_shims(accuracy.parse_collapsed(out["host"] + ".txt"))


def read_mojo(data):
    """Austin 4's binary MOJO v3 output -> (metadata dict, stacks, time_weighted).

    stacks and time_weighted are collections.Counter of stacks, each a tuple of
    (function, file) pairs root first, the way bench/accuracy.py keeps them:
    stacks counts stack events (one per thread per sample), time_weighted sums
    each event's time metric (µs, what Austin's own tools weigh a stack by).

    The format as Austin 4 writes it: "MOJ", a version number, then events,
    each one byte of type and its fields. Numbers are variable-length: the
    first byte holds 6 bits, a sign bit (0x40) and a continuation bit (0x80),
    each further byte 7 bits and a continuation bit. Strings end in NUL.
    A stack event starts a thread sample; frame events (3) and string events
    (11) only define a frame or a string under a key; the frames of the sample
    are the frame references (5) that follow, root first, then its metrics."""
    if data[:3] != b"MOJ":
        raise ValueError("not a MOJO file")
    pos = 3

    def integer():
        nonlocal pos
        b = data[pos]
        pos += 1
        val, neg, shift = b & 0x3F, b & 0x40, 6
        while b & 0x80:
            b = data[pos]
            pos += 1
            val |= (b & 0x7F) << shift
            shift += 7
        return -val if neg else val

    def string():
        nonlocal pos
        end = data.index(b"\0", pos)
        s = data[pos:end].decode("utf-8", "replace")
        pos = end + 1
        return s

    integer()  # version
    meta, strings, frames = {}, {}, {}
    stacks, time_weighted = collections.Counter(), collections.Counter()
    current, weight = None, 0

    def flush():
        if current is not None:
            stack = tuple(current)
            stacks[stack] += 1
            time_weighted[stack] += weight

    while pos < len(data):
        ev = data[pos]
        pos += 1
        if ev == 1:      # metadata: key, value
            k = string()
            meta[k] = string()
        elif ev == 2:    # stack: pid, iid, thread id; starts a new thread sample
            integer(); integer(); string()
            flush()
            current, weight = [], 0
        elif ev == 3:    # frame definition: key, filename ref, scope ref, line, line_end, col, col_end
            key, file_ref, scope_ref = integer(), integer(), integer()
            for _ in range(4):
                integer()
            frames[key] = (file_ref, scope_ref)
        elif ev == 4:    # invalid frame: one frame of the sample Austin could not read
            if current is not None:
                current.append(("INVALID", ""))
        elif ev == 5:    # frame reference: the next frame of the sample
            key = integer()
            file_ref, scope_ref = frames.get(key, (None, None))
            if current is not None:
                current.append((strings.get(scope_ref, "?"), strings.get(file_ref, "?")))
        elif ev in (7, 8):  # gc, idle: flags of the sample, no payload
            pass
        elif ev == 9:    # time metric (µs)
            weight += integer()
        elif ev in (10, 12):  # memory metric, string ref
            integer()
        elif ev == 6:    # kernel frame
            name = string()
            if current is not None:
                current.append((name, "kernel"))
        elif ev == 11:   # string definition: key, value
            key = integer()
            strings[key] = string()
        else:
            raise ValueError("unknown MOJO event %d at byte %d" % (ev, pos - 1))
    flush()
    return meta, stacks, time_weighted


def parse_mojo(data):
    """Austin 4's binary MOJO v3 output -> (metadata dict, number of stack events)."""
    meta, stacks, _ = read_mojo(data)
    return meta, sum(stacks.values())


class Austin(Profiler):
    name = "austin"

    def __init__(self):
        self.exe = os.path.join(TOOLS, "austin")
        self.prefix = None
        self.why_not = None
        if not os.path.exists(self.exe):
            self.why_not = "not installed (%s)" % self.exe
            return
        # austin-dist 4.0's binary needs glibc 2.38; on an older host (bookworm: 2.36)
        # run it with the sid chroot's dynamic loader and libc, unchanged otherwise.
        if subprocess.run([self.exe, "--version"], capture_output=True).returncode == 0:
            self.prefix = []
        else:
            ld = os.path.join(SID, "lib64", "ld-linux-x86-64.so.2")
            libs = os.path.join(SID, "usr", "lib", "x86_64-linux-gnu")
            prefix = [ld, "--library-path", libs]
            if os.path.exists(ld) and subprocess.run(prefix + [self.exe, "--version"],
                                                     capture_output=True).returncode == 0:
                self.prefix = prefix
                self.via = "sid's ld.so (host glibc too old)"
            else:
                self.why_not = "cannot run %s (glibc too old and no sid chroot)" % self.exe

    def command(self, target, rate, secs, out):
        interval_us = max(1, int(round(1e6 / rate)))
        return self.prefix + [self.exe, "-i", "%dus" % interval_us, "-p", str(target.pid),
                              "-x", str(secs), "-o", out["host"] + ".mojo"]

    def parse(self, out, run):
        with open(out["host"] + ".mojo", "rb") as f:
            meta, stacks = parse_mojo(f.read())
        if "duration" not in meta:
            raise RuntimeError("no samples")
        errors = {}
        m = re.match(r"(\d+)/(\d+)", meta.get("errors", ""))
        if m and int(m.group(1)):
            errors["errors"] = int(m.group(1))
        return {"samples": stacks, "seconds": int(meta["duration"]) / 1e6, "errors": errors,
                "sampling_us_min_avg_max": meta.get("sampling")}

    def stacks(self, out, run):
        # Counted per stack event, as py-spy and pyprof count samples (the
        # time-weighted shares are in the accuracy rows' JSON too).
        with open(out["host"] + ".mojo", "rb") as f:
            _, stacks, timed = read_mojo(f.read())
        run["time_weighted_stacks"] = timed
        return stacks


class Tachyon(Profiler):
    """CPython 3.15's own sampler, run inside the chroot, joined to the target's mount ns.
    blocking: its --blocking (ptrace-stops every thread of the target for each sample)."""

    def __init__(self, blocking=False):
        self.blocking = blocking
        self.name = "tachyon --blocking" if blocking else "tachyon"

    def supports(self, py, rate):
        return py.label == "3.15"

    def command(self, target, rate, secs, out):
        if not target.private_proc:
            raise Skip("target not in a private mount namespace (unshare failed): /proc is not visible in the chroot")
        return ["nsenter", "-t", str(target.pid), "-m", "--", "chroot", SID,
                "python3.15", "-m", "profiling.sampling", "attach", "-r", str(rate), "-d", str(secs)] + \
            (["--blocking"] if self.blocking else []) + ["--collapsed", "-o", out["inner"] + ".txt", str(target.pid)]

    def parse(self, out, run):
        samples = collapsed_samples(out["host"] + ".txt")
        m = re.search(r"Captured (\d+) samples in ([\d.]+) seconds", run["log"])
        seconds = float(m.group(2)) if m else run["wall"]
        notes = []
        e = re.search(r"Error rate: ([\d.]+)", run["log"])
        if e and float(e.group(1)) > 0:
            notes.append("error rate %s%%" % e.group(1))
        return {"samples": samples, "seconds": seconds, "notes": notes,
                "tool_reported_samples": int(m.group(1)) if m else None}

    def stacks(self, out, run):
        # --collapsed lines: "tid:N;file.py:function:line;... count", root first;
        # Tachyon's own markers (<GC>, <native>) are one bare name.
        stacks = collections.Counter()
        with open(out["host"] + ".txt", encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if not line.strip():
                    continue
                text, count = line.rsplit(" ", 1)
                frames = []
                for part in text.split(";"):
                    if part.startswith("tid:"):
                        continue
                    bits = part.rsplit(":", 2)
                    frames.append((bits[1], bits[0]) if len(bits) == 3 else (part, ""))
                stacks[tuple(frames)] += int(count)
        return stacks


class Sleeper(Profiler):
    """The control: bench/sleeper.c on the profilers' CPU, waking at the same
    rate and reading nothing. Its slowdown column is what merely running a
    sampler's timer next to the target costs on this machine (the host's
    scheduling of the VM's CPUs, shared caches): the yardstick for the others'."""
    name = "sleeper (control)"
    has_stacks = False

    def __init__(self, exe):
        self.exe = exe

    def supports(self, py, rate):
        return rate <= 10000   # the rates a sampler sleeps between ticks at

    def command(self, target, rate, secs, out):
        return [self.exe, str(rate), str(secs), out["host"] + ".txt"]

    def parse(self, out, run):
        with open(out["host"] + ".txt") as f:
            ticks, seconds = f.read().split()
        return {"samples": int(ticks), "seconds": float(seconds)}


def build_sleeper(tmp):
    """Compile bench/sleeper.c into the work directory; None (with why) if no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc) to build bench/sleeper.c"
    exe = os.path.join(tmp["host"], "sleeper")
    r = subprocess.run([cc, "-O2", "-o", exe, os.path.join(BENCH, "sleeper.c")], capture_output=True, text=True)
    if r.returncode != 0:
        return None, "bench/sleeper.c did not compile: %s" % r.stderr.strip().splitlines()[-1:]
    return exe, None


class Skip(Exception):
    pass


# --------------------------------------------------------------------------- one measurement

def proc_cpu(pid):
    """utime+stime of the whole process pid (its live and exited threads), in seconds;
    None once it is gone. (Per-thread schedstat would miss exited threads.)"""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


class LineLog:
    """Copies a child's merged stdout/stderr to a file, remembering when each line came."""

    def __init__(self, path):
        self.f = open(path, "w")
        self.lines = []   # (monotonic, line)

    def pump(self, pipe):
        def run():
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace")
                self.lines.append((time.monotonic(), line))
                self.f.write(line)
            self.f.close()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def text(self):
        self.thread.join(5)
        return "".join(l for _, l in self.lines)

    def first(self, needle):
        return next((t for t, l in self.lines if needle in l), None)


def start_profiler(prof, target, rate, secs, out):
    """Launch prof against target for secs, pinned, its output logged. Returns
    (process, log, start time, deadline): py-spy keeps going until it has rate x
    secs samples, so a run gets secs plus at least 5 s before SIGINT."""
    cmd = prof.command(target, rate, secs, out)
    logf = LineLog(out["host"] + ".log")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=pinned(PROFILER_CPU))
    logf.pump(p.stdout)
    return p, logf, t0, t0 + secs + max(5.0, secs)


def run_one(prof, target, rate, secs, out):
    """Launch prof against target for secs; measure the target's throughput while it runs."""
    p, logf, t0, cap = start_profiler(prof, target, rate, secs, out)
    status = rusage = None
    t_exit = None

    def reap(block=False):
        nonlocal status, rusage, t_exit
        if status is not None:
            return True
        pid, st, ru = os.wait4(p.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        status, rusage, t_exit = st, ru, time.monotonic()
        p.returncode = os.waitstatus_to_exitcode(st)
        return True

    during = []
    cpu_marks = []   # (monotonic, profiler cpu s) while it samples, for the steady-state rate
    interrupted = False
    while time.monotonic() < t0 + SETTLE and not reap():
        time.sleep(0.05)
    if not reap():
        a = target.snapshot()
        cpu_marks.append((time.monotonic(), proc_cpu(p.pid)))
        while True:
            time.sleep(WINDOW)
            if reap():
                break   # the profiler ended inside this window: a partial window, dropped
            b = target.snapshot()
            c = proc_cpu(p.pid)
            if reap():
                break
            during.append(rate_between(a, b))
            cpu_marks.append((time.monotonic(), c))
            a = b
            if time.monotonic() > cap and not interrupted:
                p.send_signal(signal.SIGINT)   # every peer writes its output on Ctrl-C
                interrupted = True
                cap += 10
            elif time.monotonic() > cap:
                p.kill()
                reap(block=True)
                break
    reap(block=True)
    run = {"wall": t_exit - t0, "log": logf.text(), "rc": p.returncode, "t0": t0, "t_exit": t_exit,
           "first_line": logf.first}
    p.stdout.close()
    cpu = rusage.ru_utime + rusage.ru_stime
    steady = None
    marks = [m for m in cpu_marks if m[1] is not None]
    if len(marks) >= 2 and marks[-1][0] > marks[0][0]:
        steady = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
    return run, cpu, steady, during, interrupted


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def record_failure(row, run, e):
    """A profiler left no output it could parse: say why in the row's note, from its log."""
    tail = [l.strip() for l in run["log"].splitlines() if l.strip() and "\x1b" not in l]
    why = next((l for l in tail if re.search(r"(?i)error|fail|cannot|unsupported|not supported|permission", l)),
               tail[-1] if tail else str(e))
    why = re.sub(r"^\W+", "", why).split(". ")[0]
    row["note"] = "failed (rc %s): %s" % (run["rc"], why[:80])
    row["log_tail"] = tail[-5:]


def measure(prof, py, depth, target, rate, secs, base_before, tmp, seq):
    row = {"profiler": prof.name, "python": py.label, "depth": depth, "rate": rate,
           "duration_requested": secs}
    out = {"host": os.path.join(tmp["host"], "run%03d" % seq),
           "inner": os.path.join(tmp["chroot_inner"], "run%03d" % seq)}
    if py.chroot:
        # chrooted tools (Tachyon) write into the chroot; the host reads it there
        out["host_chroot"] = os.path.join(SID, out["inner"].lstrip("/"))
    try:
        run, cpu, steady, during, interrupted = run_one(prof, target, rate, secs, out)
    except Skip as e:
        row["note"] = "skipped: %s" % e
        return row, target.windows(BASE_WINDOWS)
    base_after = target.windows(BASE_WINDOWS)
    if "host_chroot" in out and isinstance(prof, Tachyon):
        out = dict(out, host=out["host_chroot"])
    row.update({"rc": run["rc"], "wall_secs": round(run["wall"], 3), "cpu_secs": round(cpu, 4)})
    try:
        parsed = prof.parse(out, run)
    except Exception as e:  # no output: could not attach
        record_failure(row, run, e)
        return row, base_after
    samples, seconds = parsed.pop("samples"), parsed.pop("seconds")
    notes = parsed.pop("notes", [])
    if interrupted:
        notes.append("stopped by SIGINT after %.0fs" % run["wall"])
    row.update(parsed)
    base = base_before + base_after
    row.update({
        "samples": samples,
        "seconds": round(seconds, 3),
        "achieved_hz": samples / seconds if seconds else float("nan"),
        "cpu_us_per_sample": cpu * 1e6 / samples if samples else float("nan"),
        "cpu_s_per_1000_samples": cpu * 1000 / samples if samples else float("nan"),
        "steady_cpu_us_per_sample": (steady * 1e6 / (samples / seconds)) if steady is not None and samples else None,
        "target_units_per_s_base": median(base),
        "target_units_per_s_profiled": median(during),
        "windows_base": len(base),
        "windows_profiled": len(during),
        "slowdown_pct": (1 - median(during) / median(base)) * 100 if during and base else float("nan"),
    })
    if samples and samples < 0.9 * rate * secs:
        notes.append("rate not reached")
    if notes:
        row["note"] = "; ".join(notes)
    return row, base_after


# --------------------------------------------------------------------------- accuracy scenario
#
# tests/scripts/short_calls.py runs `t += f(g(p))` in `loop`: two calls of well
# under a microsecond each. A profiler's leaf shares loop/g/f on it are compared
# with those of py-spy's default mode (it ptrace-stops the target for each
# sample, so each of its samples is one instant), at 1 kHz, recorded on the same
# target process just before and just after the profilers; the reference is the
# mean of the two, their gap the noise floor.

SHORT_FUNCS = accuracy.SHORT_CALL_FUNCS   # ("loop", "g", "f")
REFERENCE_RATE = 1000


def run_plain(prof, target, rate, secs, out):
    """Launch prof against target for secs and wait for it (short_calls.py answers
    no SIGUSR1, so no throughput windows); the same cap and SIGINT as run_one."""
    p, logf, t0, cap = start_profiler(prof, target, rate, secs, out)
    interrupted = False
    while True:
        try:
            p.wait(timeout=max(0.05, cap - time.monotonic()))
            break
        except subprocess.TimeoutExpired:
            if not interrupted:
                p.send_signal(signal.SIGINT)   # every peer writes its output on Ctrl-C
                interrupted = True
                cap += 10
            else:
                p.kill()
                p.wait()
                break
    t_exit = time.monotonic()
    run = {"wall": t_exit - t0, "log": logf.text(), "rc": p.returncode, "t0": t0, "t_exit": t_exit,
           "first_line": logf.first}
    p.stdout.close()
    return run, interrupted


def short_call_shares(stacks):
    """({loop, g, f: % of all samples whose innermost frame is that function}, % other).
    Every sample counts, so a torn one ("[stack moved while read]"), an empty or
    an unreadable one lowers the three shares."""
    leaves = {}
    for stack, n in stacks.items():
        leaf = stack[-1][0] if stack else "(no frame)"
        leaves[leaf] = leaves.get(leaf, 0) + n
    total = sum(leaves.values())
    if not total:
        return None, None
    shares = {k: 100.0 * leaves.get(k, 0) / total for k in SHORT_FUNCS}
    return shares, 100.0 * (total - sum(leaves.get(k, 0) for k in SHORT_FUNCS)) / total


def max_gap(a, b):
    return max(abs(a[k] - b[k]) for k in SHORT_FUNCS)


def accuracy_one(prof, py, target, rate, secs, tmp, tag):
    """One recording of short_calls.py: its samples, leaf shares, and pyprof's torn count."""
    row = {"profiler": prof.name, "python": py.label, "rate": rate, "duration_requested": secs}
    out = {"host": os.path.join(tmp["host"], tag), "inner": os.path.join(tmp["chroot_inner"], tag)}
    try:
        run, interrupted = run_plain(prof, target, rate, secs, out)
    except Skip as e:
        row["note"] = "skipped: %s" % e
        return row
    if py.chroot and isinstance(prof, Tachyon):
        out = dict(out, host=os.path.join(SID, out["inner"].lstrip("/")))
    row.update({"rc": run["rc"], "wall_secs": round(run["wall"], 3)})
    try:
        parsed = prof.parse(out, run)
    except Exception as e:
        record_failure(row, run, e)
        return row
    notes = parsed.get("notes", [])
    row["samples"] = parsed["samples"]
    row["achieved_hz"] = parsed["samples"] / parsed["seconds"] if parsed["seconds"] else float("nan")
    for k in ("pause_us", "pause_max_us", "torn", "torn_pct", "errors"):
        if parsed.get(k) is not None:
            row[k] = parsed[k]
    try:
        stacks = prof.stacks(out, run)
    except Exception as e:
        row["note"] = "stacks not parsed: %s" % str(e)[:80]
        return row
    shares, other = short_call_shares(stacks)
    if shares is None:
        row["note"] = "no stacks in the output"
        return row
    row.update({"shares": shares, "other_pct": other, "stack_samples": sum(stacks.values())})
    if run.get("time_weighted_stacks"):
        row["shares_time_weighted"] = short_call_shares(run["time_weighted_stacks"])[0]
    if interrupted:
        notes.append("stopped by SIGINT after %.0fs" % run["wall"])
    if notes:
        row["note"] = "; ".join(notes)
    return row


def accuracy_scenario(py, profs, rates, secs, tmp, private_proc):
    """Every profiler (except the sleeper, which takes no stacks) at every rate on one
    short_calls.py process, bracketed by two py-spy reference recordings."""
    res = {"python": py.label, "script": "tests/scripts/short_calls.py", "duration_per_run": secs,
           "reference_profiler": "py-spy", "reference_rate": REFERENCE_RATE,
           "reference_before": None, "reference_after": None, "rows": []}
    ref = PySpy(blocking=True) if os.path.exists(os.path.join(TOOLS, "py-spy")) else None
    if ref is None:
        log("accuracy: no py-spy under %s, so no reference: shares only" % TOOLS)
    try:
        target = Target(py, "short_calls", None, tmp, private_proc)
    except RuntimeError as e:
        log(str(e))
        res["note"] = "target failed to start"
        return res
    n = [0]

    def one(prof, rate, what=""):
        n[0] += 1
        if target.proc.poll() is not None:
            return {"profiler": prof.name, "python": py.label, "rate": rate, "note": "target exited"}
        log("accuracy: %-22s python %-4s %7d Hz  %gs%s" % (prof.name, py.label, rate, secs, what))
        return accuracy_one(prof, py, target, rate, secs, tmp, "acc-%s-%02d" % (py.label, n[0]))

    try:
        time.sleep(0.3)  # warm-up (3.12+ specialisation)
        if ref:
            res["reference_before"] = one(ref, REFERENCE_RATE, "  (reference, before)")
        for rate in rates:
            for prof in profs:
                if prof.has_stacks and prof.supports(py, rate):
                    res["rows"].append(one(prof, rate))
        if ref:
            res["reference_after"] = one(ref, REFERENCE_RATE, "  (reference, after)")
    finally:
        target.stop()
    refs = [r["shares"] for r in (res["reference_before"], res["reference_after"]) if r and r.get("shares")]
    if refs:
        res["reference_shares"] = {k: sum(r[k] for r in refs) / len(refs) for k in SHORT_FUNCS}
        if len(refs) == 2:
            res["noise_floor_pp"] = max_gap(refs[0], refs[1])
        for row in res["rows"]:
            if row.get("shares"):
                row["share_err_pp"] = max_gap(row["shares"], res["reference_shares"])
    return res


# --------------------------------------------------------------------------- scale scenarios (--scale)
#
# The measuring half of the "scale" issue: how pyprof copes with many threads
# (bench/threads_target.py: N threads, BUSY spinning, the rest blocked) and
# with a pre-fork server (bench/prefork_target.py: 16 workers, one replaced
# every second) under --subprocesses. No target throughput windows here: the
# questions are whether every tick comes, whether it holds every thread, and
# what the profiler pays for it.

SCALE_SETTLE = 1.0   # seconds into a scale run before its steady CPU is measured (attach and first reads left out)
SCALE_CAP = 3.0   # a run gets SCALE_CAP x its duration, then SIGINT ("fell behind"), then SIGKILL 5 s later


class ScaleProf:
    """One profiler configuration of the scale scenarios: argv and output parsing."""

    def __init__(self, tool, mode=None, nonblocking=False, sampler=None):
        self.tool, self.mode, self.nonblocking, self.sampler = tool, mode, nonblocking, sampler
        if tool == "pyprof":
            self.name = "pyprof" + (" --sampler %s" % sampler if sampler else "") + \
                (" --mode %s" % mode if mode and mode != "wall" else "") + (" --nonblocking" if nonblocking else "")
        else:
            self.name = "py-spy" + (" --nonblocking" if nonblocking else "")

    def command(self, pid, rate, secs, out, subprocesses):
        secs = "%g" % secs   # py-spy takes whole seconds only ("5", not "5.0")
        if self.tool == "pyprof":
            cmd = [PyProf.exe, "record", "--pid", str(pid), "-r", str(rate), "-d", str(secs), "-o", out + ".json"]
            cmd += ["--mode", self.mode] if self.mode else []
            cmd += ["--sampler", self.sampler] if self.sampler else []
        else:
            # --idle: keep the blocked threads, as pyprof's wall mode does; --threads:
            # a root per thread, so that per-thread coverage can be counted.
            cmd = [os.path.join(TOOLS, "py-spy"), "record", "--pid", str(pid), "-r", str(rate), "-d", str(secs),
                   "-f", "raw", "-o", out + ".txt", "--idle", "--threads"]
        cmd += ["--nonblocking"] if self.nonblocking else []
        return cmd + (["--subprocesses"] if subprocesses else [])

    def parse(self, out, logtext):
        """-> (per-thread sample counts {(pid, tid): n}, leaf stacks for the age
        probe [(pid, stack of (function, file, line)), count], extra fields)."""
        per_thread, stacks, extra = collections.Counter(), [], {}
        if self.tool == "pyprof":
            with open(out + ".json") as f:
                prof = json.load(f)
            meta = prof["meta"]
            for s in prof["stacks"]:
                th = prof["threads"][s["thread"]]
                key = (th["pid"], th["native_id"])
                per_thread[key] += s["count"]
                stacks.append((th["pid"], [(prof["frames"][i]["function"], prof["frames"][i]["file"],
                                            prof["frames"][i]["line"]) for i in s["frames"]], s["count"]))
            m = re.search(r"over (\d+) ticks", logtext)
            extra["ticks"] = int(m.group(1)) if m else None
            extra["late"] = meta.get("late")
            extra["skipped"] = (meta.get("errors") or {}).get("skipped_ticks", 0)
            extra["lost"] = {k: v for k, v in (meta.get("errors") or {}).items() if k != "skipped_ticks"}
            extra["seconds"] = meta["duration_secs"]
            extra["start_time"] = meta.get("start_time")
            smp = meta.get("sampling") or {}
            for k in ("bytes_read", "threads_walked", "frames_walked"):
                extra[k] = smp.get(k)
            m = re.search(r"held ([\d.]+) % of the time", logtext)
            extra["held_pct"] = float(m.group(1)) if m else None
            m = re.search(r"([\d.]+) reads/tick", logtext)
            extra["reads_per_tick"] = float(m.group(1)) if m else None
        else:
            # raw lines: [process P:"cmd";]...thread (TID): name;frame (file:line);... count.
            # With --subprocesses the innermost "process" element is the sampled one.
            with open(out + ".txt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.rstrip("\n")
                    if not line.strip():
                        continue
                    text, n = line.rsplit(" ", 1)
                    parts = text.split(";")
                    procs = [p for p in parts if re.match(r'process \d+:', p)]
                    pid = int(re.match(r"process (\d+):", procs[-1]).group(1)) if procs else None
                    tid = next((p for p in parts if p.startswith("thread (")), None)
                    tid = re.match(r"thread \((\w+)\)", tid).group(1) if tid else None
                    per_thread[(pid, tid)] += int(n)
                    frames = []
                    for p in parts:
                        m = re.match(r"(.*) \((.*):(\d+)\)$", p)
                        if m:
                            frames.append((m.group(1), m.group(2), int(m.group(3))))
                    stacks.append((pid, frames, int(n)))
            behind = re.findall(r"([\d.]+)s behind in sampling", logtext)
            if behind:
                extra["behind_s"] = float(behind[-1])
            m = re.search(r"Samples: (\d+) Errors: (\d+)", logtext)
            if m and int(m.group(2)):
                extra["lost"] = {"errors": int(m.group(2))}
        return per_thread, stacks, extra


def scale_run(prof, target, rate, secs, out, subprocesses=False):
    """Run prof against target (pinned as the matrix pins it), at most SCALE_CAP x secs.
    -> dict(log, rc, wall, cpu, maxrss_kb, fell_behind, sampling_secs (py-spy: from its
    "Sampling process" line to its exit))."""
    cmd = prof.command(target.pid, rate, secs, out, subprocesses)
    logf = LineLog(out + ".log")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=pinned(PROFILER_CPU))
    logf.pump(p.stdout)
    cap, fell_behind = t0 + SCALE_CAP * secs, False
    hwm = None
    marks = []   # (monotonic, profiler CPU s) from SCALE_SETTLE on: the steady cost, start-up left out
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() >= t0 + SCALE_SETTLE:
            c = proc_cpu(p.pid)
            if c is not None:
                marks.append((time.monotonic(), c))
        # Peak RSS: VmHWM as last read (every 50 ms) before the exit. Not wait4's
        # ru_maxrss: that keeps the high-water mark of the forked run.py from
        # before exec (about 20 MB) for every child.
        try:
            with open("/proc/%d/status" % p.pid) as f:
                hwm = int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
        except (OSError, StopIteration, ValueError):
            pass
        if time.monotonic() > cap:
            if not fell_behind:
                p.send_signal(signal.SIGINT)   # both write their output on Ctrl-C
                fell_behind, cap = True, cap + 5
            else:
                p.kill()
        time.sleep(0.05)
    t_exit = time.monotonic()
    p.stdout.close()
    text = logf.text()
    # py-spy keeps sampling until it has rate x secs samples however late, so its
    # wall time is from its "Sampling process" line to its exit, as in the matrix.
    start = logf.first("Sampling process") if prof.tool == "py-spy" else None
    # The last mark is dropped: it may fall after the profiler stopped sampling.
    steady = None
    if len(marks) >= 3 and marks[-2][0] > marks[0][0]:
        steady = (marks[-2][1] - marks[0][1]) / (marks[-2][0] - marks[0][0])
    return {"log": text, "rc": os.waitstatus_to_exitcode(st), "wall": t_exit - t0, "cpu": ru.ru_utime + ru.ru_stime,
            "steady_cpu_per_s": steady, "maxrss_kb": hwm, "fell_behind": fell_behind,
            "sampling_secs": (t_exit - start) if start else None}


def thread_row(prof, py, n, rate, secs, target, tmp, seq):
    row = {"profiler": prof.name, "python": py.label, "threads": n, "rate": rate, "duration_requested": secs}
    out = os.path.join(tmp["host"], "scale%03d" % seq)
    run = scale_run(prof, target, rate, secs, out)
    row.update({"rc": run["rc"], "wall_secs": round(run["wall"], 3), "cpu_secs": round(run["cpu"], 4),
                "peak_rss_mb": run["maxrss_kb"] / 1024.0 if run["maxrss_kb"] else None})
    notes = ["fell behind: stopped after %.0f s" % run["wall"]] if run["fell_behind"] else []
    try:
        per_thread, _, extra = prof.parse(out, run["log"])
    except Exception as e:
        record_failure(row, dict(run, rc=run["rc"]), e)
        return row
    samples = sum(per_thread.values())
    if prof.tool == "pyprof":
        ticks, seconds = extra["ticks"], extra["seconds"]
        scheduled = ticks + extra["skipped"] if ticks is not None else None
        row["on_time_pct"] = 100.0 * (ticks - extra["late"]) / scheduled if scheduled else None
        row.update({k: extra[k] for k in ("late", "skipped", "held_pct", "reads_per_tick",
                                          "bytes_read", "threads_walked", "frames_walked")})
    else:
        # a py-spy tick records each thread once: its ticks are the best-covered thread's count
        ticks = max(per_thread.values()) if per_thread else 0
        seconds = run["sampling_secs"] or run["wall"]
        if extra.get("behind_s"):
            notes.append("%.1fs behind" % extra["behind_s"])
    if extra.get("lost"):
        row["lost"] = extra["lost"]
    row.update({"ticks": ticks, "samples": samples, "seconds": seconds,
                "achieved_hz": ticks / seconds if seconds and ticks is not None else None,
                "samples_per_tick": samples / ticks if ticks else None,
                "threads_seen": len(per_thread)})
    if ticks and prof.mode in (None, "wall"):
        # every thread's stack in every tick: the worst thread's share of the ticks,
        # and all thread samples over N x ticks (threads never seen count as 0)
        row["min_thread_cover_pct"] = 100.0 * (min(per_thread.values()) if len(per_thread) >= n else 0) / ticks
        row["all_threads_cover_pct"] = 100.0 * samples / (n * ticks)
    if ticks:
        row["cpu_us_per_tick"] = run["cpu"] * 1e6 / ticks
        if run["steady_cpu_per_s"] is not None and seconds:
            row["steady_cpu_us_per_tick"] = run["steady_cpu_per_s"] * 1e6 / (ticks / seconds)
    if samples:
        row["cpu_us_per_thread_sample"] = run["cpu"] * 1e6 / samples
    if notes:
        row["note"] = "; ".join(notes)
    return row


AGE_STEP, AGE_FIRST_LINE = 0.002, 2   # as in bench/prefork_target.py


def process_rows(prof, py, rate, secs, workers, churn, tmp, seq):
    """One recording of a fresh pre-fork target: a summary row and a row per worker."""
    row = {"profiler": prof.name + " --subprocesses", "python": py.label, "rate": rate, "workers": workers,
           "duration_requested": secs}
    name = "prefork%03d.log" % seq
    inner = os.path.join(tmp["chroot_inner"] if py.chroot else tmp["host"], name)
    host_log = os.path.join(SID, inner.lstrip("/")) if py.chroot else inner
    try:
        target = Target(py, "prefork", seq, tmp, False, [str(workers), inner, str(churn)])
    except RuntimeError as e:
        row["note"] = str(e)[:100]
        return row, []
    out = os.path.join(tmp["host"], "scale%03d" % seq)
    try:
        time.sleep(0.3)
        run = scale_run(prof, target, rate, secs, out, subprocesses=True)
        t_end = time.time()
    finally:
        target.stop()
    row.update({"rc": run["rc"], "wall_secs": round(run["wall"], 3), "cpu_secs": round(run["cpu"], 4),
                "peak_rss_mb": run["maxrss_kb"] / 1024.0 if run["maxrss_kb"] else None})
    try:
        per_thread, stacks, extra = prof.parse(out, run["log"])
    except Exception as e:
        record_failure(row, run, e)
        return row, []
    with open(host_log) as f:
        lives = [json.loads(l) for l in f if l.strip()]
    # The window sampled: pyprof's meta start_time + duration; py-spy's from its
    # "Sampling process" line to its exit (wall clock, as the target logs).
    if prof.tool == "pyprof" and extra.get("start_time"):
        w0, w1 = extra["start_time"], extra["start_time"] + extra["seconds"]
    else:
        w1 = t_end
        w0 = t_end - (run["sampling_secs"] or run["wall"])
    per_pid = collections.Counter()
    for (pid, _), n in per_thread.items():
        per_pid[pid] += n
    # the age probe: the earliest age_ms line seen per worker = its first sample's age
    first_age = {}
    for pid, frames, n in stacks:
        for fn, file, line in frames:
            if fn == "age_ms" and file == "<age>" and line is not None:
                age = (line - AGE_FIRST_LINE) * AGE_STEP
                first_age[pid] = min(first_age.get(pid, age), age)
    wrows = []
    for w in lives:
        end = w["end"] if w["end"] is not None else t_end
        life0, life1 = max(w["start"], w0), min(end, w1)
        if life1 <= life0:
            continue   # not alive while sampled
        born_inside = w["start"] >= w0
        got = per_pid.get(w["pid"], 0)
        span = life1 - life0
        wrows.append({"pid": w["pid"], "born_while_sampled": born_inside, "sampled_secs": span,
                      "samples": got, "rate_hz": got / span,
                      "life_covered_pct": 100.0 * got / (span * rate),
                      "first_sample_age_ms": first_age[w["pid"]] * 1000 if w["pid"] in first_age else None})
    parent = per_pid.get(target.pid, 0)
    born = [w for w in wrows if w["born_while_sampled"]]
    row.update({
        "seconds": w1 - w0,
        "worker_pids_alive": len(wrows), "workers_born": len(born),
        "workers_sampled": sum(1 for w in wrows if w["samples"]),
        "born_sampled": sum(1 for w in born if w["samples"]),
        "parent_hz": parent / (w1 - w0) if w1 > w0 else None,
        "worker_hz_median": median([w["rate_hz"] for w in wrows]),
        "worker_hz_min": min((w["rate_hz"] for w in wrows), default=None),
        "life_covered_pct_median": median([w["life_covered_pct"] for w in wrows]),
        "born_covered_pct_median": median([w["life_covered_pct"] for w in born]),
        "first_sample_ms_median": median([w["first_sample_age_ms"] for w in born if w["first_sample_age_ms"] is not None]),
        "first_sample_ms_max": max((w["first_sample_age_ms"] for w in born if w["first_sample_age_ms"] is not None), default=None),
        "born_no_age_sample": sum(1 for w in born if w["first_sample_age_ms"] is None),
        "cpu_us_per_sample": run["cpu"] * 1e6 / sum(per_pid.values()) if per_pid else None,
    })
    if prof.tool == "pyprof":
        row.update({k: extra[k] for k in ("late", "skipped", "held_pct", "reads_per_tick", "ticks")})
    notes = ["fell behind: stopped after %.0f s" % run["wall"]] if run["fell_behind"] else []
    if extra.get("behind_s"):
        notes.append("%.1fs behind" % extra["behind_s"])
    if extra.get("lost"):
        row["lost"] = extra["lost"]
    if notes:
        row["note"] = "; ".join(notes)
    return row, wrows


def scale(args, tmp):
    pythons = find_pythons(args.pythons.split(","), False)
    have_pyspy = os.path.exists(os.path.join(TOOLS, "py-spy"))
    if not have_pyspy:
        log("skipping py-spy: not installed under %s (scripts/setup-fixtures.sh)" % TOOLS)
    secs = args.duration
    rate = args.scale_rate
    counts = [1] + [int(n) for n in args.scale_threads.split(",")]
    # Each sampler named: as root, pyprof's default is the kernel sampler.
    thread_profs = [ScaleProf("pyprof", mode, sampler=sampler) for sampler in ("ptrace", "kernel") for mode in ("wall", "cpu", "gil")]
    if have_pyspy:
        thread_profs += [ScaleProf("py-spy", nonblocking=True), ScaleProf("py-spy")]
    rows, seq = [], 0
    for py in ([] if args.scale_only == "processes" else pythons):
        for n in counts:
            try:
                target = Target(py, "threads", n, tmp, False, [str(n), str(args.scale_busy)])
            except RuntimeError as e:
                log(str(e))
                rows.append({"profiler": "-", "python": py.label, "threads": n, "note": "target failed to start"})
                continue
            try:
                time.sleep(0.3)
                for prof in thread_profs:
                    rates = [rate]
                    if prof.tool == "py-spy" and n >= 1000 and rate > 100:
                        rates.append(100)   # in case 1 kHz is hopeless for it
                    for r in rates:
                        seq += 1
                        log("scale: %-22s python %-4s %4d threads  %5d Hz  %gs" % (prof.name, py.label, n, r, secs))
                        rows.append(thread_row(prof, py, n, r, secs, target, tmp, seq))
            finally:
                target.stop()
    # CPU per tick against the one-thread target, same profiler, python and rate
    for key, out in (("cpu_us_per_tick", "cpu_vs_1_thread"), ("steady_cpu_us_per_tick", "steady_vs_1_thread")):
        ref = {(r["profiler"], r["python"], r["rate"]): r.get(key) for r in rows if r.get("threads") == 1}
        for r in rows:
            base = ref.get((r["profiler"], r["python"], r.get("rate")))
            if base and r.get(key):
                r[out] = r[key] / base

    proc_rows, worker_rows = [], []
    proc_profs = [ScaleProf("pyprof"), ScaleProf("pyprof", nonblocking=True)]
    if have_pyspy:
        proc_profs += [ScaleProf("py-spy"), ScaleProf("py-spy", nonblocking=True)]
    proc_pythons = [p for p in pythons if p.label in args.scale_proc_pythons.split(",")]
    for py in ([] if args.scale_only == "threads" else proc_pythons):
        for r in [int(x) for x in args.scale_proc_rates.split(",")]:
            for prof in proc_profs:
                seq += 1
                log("scale: %-22s python %-4s %d workers  %5d Hz  %gs" % (prof.name + " --subprocesses", py.label,
                                                                         args.scale_workers, r, args.scale_proc_secs))
                row, wrows = process_rows(prof, py, r, args.scale_proc_secs, args.scale_workers, 1.0, tmp, seq)
                proc_rows.append(row)
                for w in wrows:
                    worker_rows.append(dict(w, profiler=row["profiler"], python=py.label, rate=r))
    return rows, proc_rows, worker_rows


THREAD_COLUMNS = [
    ("profiler", "profiler", "%s"),
    ("python", "python", "%s"),
    ("threads", "threads", "%d"),
    ("rate", "rate req", "%d"),
    ("achieved_hz", "ticks/s", "%.0f"),
    ("on_time_pct", "on time %", "%.1f"),
    ("samples_per_tick", "samples/tick", "%.1f"),
    ("min_thread_cover_pct", "worst thread %", "%.1f"),
    ("all_threads_cover_pct", "all threads %", "%.1f"),
    ("cpu_secs", "CPU s", "%.2f"),
    ("cpu_us_per_tick", "CPU µs/tick", "%.0f"),
    ("cpu_us_per_thread_sample", "CPU µs/thread-sample", "%.2f"),
    ("cpu_vs_1_thread", "vs 1 thread", "%.1f"),
    ("steady_cpu_us_per_tick", "steady µs/tick", "%.0f"),
    ("steady_vs_1_thread", "steady vs 1", "%.1f"),
    ("held_pct", "held %", "%.1f"),
    ("peak_rss_mb", "peak RSS MB", "%.1f"),
    ("note", "note", "%s"),
]

PROC_COLUMNS = [
    ("profiler", "profiler", "%s"),
    ("python", "python", "%s"),
    ("rate", "rate req", "%d"),
    ("seconds", "secs", "%.1f"),
    ("worker_pids_alive", "workers", "%d"),
    ("workers_born", "born", "%d"),
    ("born_sampled", "born sampled", "%d"),
    ("worker_hz_median", "worker Hz med", "%.0f"),
    ("worker_hz_min", "worker Hz min", "%.0f"),
    ("life_covered_pct_median", "life covered % med", "%.0f"),
    ("first_sample_ms_median", "1st sample ms med", "%.0f"),
    ("first_sample_ms_max", "1st sample ms max", "%.0f"),
    ("born_no_age_sample", "born, none <0.5s", "%d"),
    ("parent_hz", "parent Hz", "%.0f"),
    ("cpu_secs", "CPU s", "%.2f"),
    ("peak_rss_mb", "peak RSS MB", "%.1f"),
    ("note", "note", "%s"),
]


# --------------------------------------------------------------------------- output

COLUMNS = [
    ("profiler", "profiler", "%s"),
    ("python", "python", "%s"),
    ("depth", "depth", "%d"),
    ("rate", "rate req", "%d"),
    ("achieved_hz", "achieved Hz", "%.0f"),
    ("cpu_us_per_sample", "CPU µs/sample", "%.1f"),
    ("bpf_us_per_sample", "BPF µs/sample", "%.1f"),
    ("cpu_s_per_1000_samples", "CPU s/1000 samples", "%.4f"),
    ("slowdown_pct", "target slowdown %", "%.1f"),
    ("share_err_pp", "share error pp", "%.1f"),
    ("steady_cpu_us_per_sample", "steady CPU µs/sample", "%.1f"),
    ("syscalls_per_sample", "syscalls/sample", "%.2f"),
    ("readv_floor_us", "readv floor µs", "%.1f"),
    ("wake_floor_us", "wake floor µs", "%.1f"),
    ("ratio_to_floor", "ratio to floor", "%.1f"),
    ("pause_us", "held µs/sample", "%.0f"),
    ("merged_pct", "merged %", "%.1f"),
    ("note", "note", "%s"),
]


def fmt(v, f):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f % v


ACCURACY_COLUMNS = [
    ("profiler", "profiler", "%s"),
    ("python", "python", "%s"),
    ("rate", "rate req", "%d"),
    ("achieved_hz", "achieved Hz", "%.0f"),
    ("stack_samples", "samples", "%d"),
    ("loop", "loop %", "%.1f"),
    ("g", "g %", "%.1f"),
    ("f", "f %", "%.1f"),
    ("other_pct", "other %", "%.1f"),
    ("share_err_pp", "share error pp", "%.1f"),
    ("pause_us", "held µs/sample", "%.0f"),
    ("note", "note", "%s"),
]


def accuracy_table(results):
    """The accuracy scenario's own table: every recording with its shares, then per
    python the reference (mean of the two py-spy runs) and their gap."""
    rows, foot = [], []
    for a in results:
        recs = [dict(a["reference_before"] or {}, profiler="py-spy (reference, before)")] if a["reference_before"] else []
        recs += a["rows"]
        if a["reference_after"]:
            recs.append(dict(a["reference_after"], profiler="py-spy (reference, after)"))
        for r in recs:
            rows.append(dict(r, **(r.get("shares") or {})))
        if a.get("note"):
            foot.append("python %s: %s" % (a["python"], a["note"]))
        elif a.get("reference_shares"):
            gap = a.get("noise_floor_pp")
            foot.append("python %s: reference loop/g/f %s %% (py-spy at %d Hz, mean of before and after); "
                        "noise floor (their gap) %s pp"
                        % (a["python"], "/".join("%.1f" % a["reference_shares"][k] for k in SHORT_FUNCS),
                           a["reference_rate"], "%.1f" % gap if gap is not None else "-"))
        else:
            foot.append("python %s: no reference (py-spy missing or failed)" % a["python"])
    return table(rows, ACCURACY_COLUMNS) + "\n" + "\n".join(foot)


def table(rows, columns=COLUMNS):
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([fmt(r.get(k), f) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = []
    for n, c in enumerate(cells):
        parts = []
        for i, v in enumerate(c):
            left = i < 2 or i == len(columns) - 1
            parts.append(v.ljust(widths[i]) if left else v.rjust(widths[i]))
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def clean_json(x):
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    if isinstance(x, dict):
        return {k: clean_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean_json(v) for v in x]
    return x


def tool_versions():
    v = {}
    a = Austin()
    for name, cmd in [("pyprof", [PYPROF, "--version"]), ("py-spy", [os.path.join(TOOLS, "py-spy"), "--version"]),
                      ("austin", (a.prefix or []) + [a.exe, "--version"]),
                      ("python3.15 (tachyon)", ["chroot", SID, "python3.15", "--version"])]:
        try:
            v[name] = subprocess.run(cmd, capture_output=True, text=True).stdout.strip() or None
        except OSError:
            pass
    for label in ("3.9", "3.12"):
        for exe in sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", label + ".*", "bin", "python" + label)))[-1:]:
            v["python" + label] = exe
    if a.prefix:
        v["austin_via"] = a.via
    return v


def snapshot_pyprof(tmp):
    """Copy target/release/pyprof aside so that one binary serves the whole run even if
    someone rebuilds it meanwhile; describe what it was built from."""
    import hashlib
    st = os.stat(PYPROF)
    copy = os.path.join(tmp["host"], "pyprof")
    shutil.copy2(PYPROF, copy)
    PyProf.exe = copy
    with open(copy, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]

    def git(*a):
        r = subprocess.run(["git", "-C", REPO] + list(a), capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"binary_mtime": datetime.datetime.fromtimestamp(st.st_mtime).astimezone().isoformat(timespec="seconds"),
            "binary_sha256": digest, "git_head": git("rev-parse", "--short", "HEAD"),
            "worktree_modified": bool(status) if status is not None else None}


def machine_meta(args):
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None),
        "loadavg_start": list(os.getloadavg()),
        "pinned": {"target_cpu": TARGET_CPU, "profiler_cpu": PROFILER_CPU} if PIN[0] else None,
        "quick": args.quick,
        "tools": tool_versions(),
    }


def wait_for_load(limit, max_wait):
    deadline = time.monotonic() + max_wait
    while True:
        load = os.getloadavg()[0]
        if load < limit:
            return load
        if time.monotonic() > deadline:
            log("1-minute load still %.2f after %.0f s; measuring anyway" % (load, max_wait))
            return load
        log("1-minute load %.2f >= %.2f; waiting 30 s" % (load, limit))
        time.sleep(30)


# --------------------------------------------------------------------------- scenarios

def make_workdir():
    host = tempfile.mkdtemp(prefix="pyprof-bench-")
    inner = "/tmp/%s" % os.path.basename(host)
    if os.path.isdir(os.path.join(SID, "tmp")):
        os.makedirs(os.path.join(SID, inner.lstrip("/")), exist_ok=True)
    return {"host": host, "chroot_inner": inner}


def remove_workdir(tmp, keep):
    if keep:
        log("kept %s and %s%s" % (tmp["host"], SID, tmp["chroot_inner"]))
        return
    shutil.rmtree(tmp["host"], ignore_errors=True)
    shutil.rmtree(os.path.join(SID, tmp["chroot_inner"].lstrip("/")), ignore_errors=True)


def can_private_proc():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t proc proc "$0/proc" && test -e "$0/proc/self/maps"', SID],
                       capture_output=True)
    return r.returncode == 0


def matrix(args, tmp):
    private_proc = can_private_proc()
    if not private_proc:
        log("cannot mount /proc in a private mount namespace (unshare -m): Tachyon will be skipped")
    pythons = find_pythons(args.pythons.split(","), private_proc)
    profs = []
    if args.native:
        # --native: merged C + Python stacks; only pyprof and py-spy do this in one tool
        profs += [PyProf(native=True), PyProf(native=True, kernel=True)]
        if os.path.exists(os.path.join(TOOLS, "py-spy")):
            profs.append(PySpy(blocking=True, native=True))
    for name in ([] if args.native else args.profilers.split(",")):
        if name == "pyprof":
            profs += [PyProf(), PyProf(nonblocking=True), PyProf(kernel=True)]
        elif name == "py-spy":
            if os.path.exists(os.path.join(TOOLS, "py-spy")):
                profs += [PySpy(blocking=False), PySpy(blocking=True)]
            else:
                log("skipping py-spy: not installed under %s (scripts/setup-fixtures.sh)" % TOOLS)
        elif name == "austin":
            a = Austin()
            if a.why_not:
                log("skipping austin: %s" % a.why_not)
            else:
                if a.prefix:
                    log("austin runs via %s" % a.via)
                profs.append(a)
        elif name == "tachyon":
            profs += [Tachyon(), Tachyon(blocking=True)]
        elif name == "sleeper":
            exe, why = build_sleeper(tmp)
            if exe:
                profs.append(Sleeper(exe))
            else:
                log("skipping the sleeper control: %s" % why)
        else:
            sys.exit("unknown profiler %r" % name)
    depths = [int(d) for d in args.depths.split(",")]
    rates = [int(float(r.lower().rstrip("k")) * (1000 if r.lower().endswith("k") else 1)) for r in args.rates.split(",")]
    secs = args.duration

    rows, seq, acc = [], 0, []
    for py in pythons:
        for depth in ([] if args.accuracy_only else depths):
            try:
                target = Target(py, "cpu", depth, tmp, private_proc)
            except RuntimeError as e:
                log(str(e))
                rows.append({"profiler": "-", "python": py.label, "depth": depth, "note": "target failed to start"})
                continue
            try:
                time.sleep(0.3)  # warm-up (3.12+ specialisation)
                floor = {"readv_floor_us": readv_floor_us(target.pid), "wake_floor_us": wake_floor_us()}
                base = target.windows(BASE_WINDOWS)
                for rate in rates:
                    for prof in profs:
                        if not prof.supports(py, rate):
                            continue
                        runs = []
                        for rep in range(args.repeat):
                            seq += 1
                            log("%-22s python %-4s depth %3d  %5d Hz  %gs%s" % (prof.name, py.label, depth, rate, secs,
                                "  (run %d of %d)" % (rep + 1, args.repeat) if args.repeat > 1 else ""))
                            r, base = measure(prof, py, depth, target, rate, secs, base, tmp, seq)
                            runs.append(r)
                        # With --repeat, the row is the run with the median slowdown
                        # (every run's slowdown is kept alongside).
                        ok = [r for r in runs if r.get("slowdown_pct") is not None and not math.isnan(r["slowdown_pct"])]
                        row = sorted(ok, key=lambda r: r["slowdown_pct"])[len(ok) // 2] if ok else runs[0]
                        if args.repeat > 1:
                            row["slowdown_pct_runs"] = [r.get("slowdown_pct") for r in runs]
                            row["cpu_us_per_sample_runs"] = [r.get("cpu_us_per_sample") for r in runs]
                        row.update(floor)
                        if row.get("cpu_us_per_sample") and not math.isnan(row["cpu_us_per_sample"]):
                            row["ratio_to_floor"] = row["cpu_us_per_sample"] / (floor["readv_floor_us"] + floor["wake_floor_us"])
                        rows.append(row)
                        if args.verbose:
                            log("  -> %s" % json.dumps(clean_json({k: v for k, v in row.items() if k != "log_tail"})))
            finally:
                target.stop()
        if args.native or args.no_accuracy:
            continue
        # The accuracy scenario: its own target (short_calls.py), the same profilers
        # and rates; its error fills the "share error pp" column of this python's rows.
        a = accuracy_scenario(py, profs, rates, secs, tmp, private_proc)
        acc.append(a)
        err = {(r["profiler"], r["rate"]): r.get("share_err_pp") for r in a["rows"]}
        for row in rows:
            if row["python"] == py.label and row.get("rate") is not None:
                row["share_err_pp"] = err.get((row["profiler"], row["rate"]))
    return rows, acc


def memory(args, tmp):
    py = find_pythons([args.memory_python], False)
    if not py:
        sys.exit("no Python %s for the memory scenario" % args.memory_python)
    py = py[0]
    target = Target(py, "memory", args.memory_stacks, tmp, False)
    out = os.path.join(tmp["host"], "memory.json")
    cmd = [PyProf.exe, "record", "--pid", str(target.pid), "-r", str(args.memory_rate),
           "-d", str(args.memory_secs), "-o", out, "-q"]
    log("memory: pyprof at %d Hz for %d s against %d distinct stacks (python %s)"
        % (args.memory_rate, args.memory_secs, args.memory_stacks, py.label))
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    trace = []  # (seconds since start, VmRSS kB, VmHWM kB)
    try:
        while True:
            time.sleep(1.0)
            pid, st, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            try:
                with open("/proc/%d/status" % p.pid) as f:
                    status = dict(l.split(":", 1) for l in f if ":" in l)
                trace.append((round(time.monotonic() - t0, 1), int(status["VmRSS"].split()[0]),
                              int(status["VmHWM"].split()[0])))
            except (OSError, KeyError):
                pass
    finally:
        target.stop()
    p.returncode = os.waitstatus_to_exitcode(st)
    if p.returncode != 0:
        sys.exit("pyprof failed (rc %d)" % p.returncode)
    with open(out) as f:
        prof = json.load(f)
    meta = prof["meta"]
    funcs = set()
    for s in prof["stacks"]:
        funcs.add(tuple(prof["frames"][i]["function"] for i in s["frames"]))
    cpu = ru.ru_utime + ru.ru_stime
    res = {
        "python": py.label,
        "rate": args.memory_rate,
        "duration_requested": args.memory_secs,
        "samples": meta["samples"],
        "seconds": meta["duration_secs"],
        "achieved_hz": meta["samples"] / meta["duration_secs"],
        "late": meta.get("late"),
        "errors": meta.get("errors"),
        "distinct_stacks": len(prof["stacks"]),
        "distinct_function_stacks": len(funcs),
        "frames": len(prof["frames"]),
        "peak_rss_kb_vmhwm": max((t[2] for t in trace), default=None),
        "peak_rss_kb_maxrss": ru.ru_maxrss,
        "rss_kb_after_1s": trace[0][1] if trace else None,
        "rss_kb_last": trace[-1][1] if trace else None,
        "output_bytes": os.path.getsize(out),
        "cpu_secs": cpu,
        "cpu_us_per_sample": cpu * 1e6 / meta["samples"] if meta["samples"] else None,
        "rss_trace": trace[:: max(1, len(trace) // 60)],
    }
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 s per measurement instead of 5")
    ap.add_argument("--duration", type=float, help="seconds per measurement (default 5, --quick 2)")
    ap.add_argument("--pythons", default="3.12,3.15,3.9", help="comma list of 3.X (3.15 = the sid chroot)")
    ap.add_argument("--profilers", default="pyprof,py-spy,austin,tachyon,sleeper",
                    help="comma list; sleeper is the control: wakes at the rate, reads nothing (rates <= 10000)")
    ap.add_argument("--depths", default="3,100")
    ap.add_argument("--rates", default=None, help="comma list (default 1000,10000,1000000; 1000000 asks every tool to sample back to back; --native: 100,1000)")
    ap.add_argument("--native", action="store_true",
                    help="merged C+Python stacks: pyprof --native vs py-spy --native (default rates 100,1000)")
    ap.add_argument("--accuracy-only", action="store_true",
                    help="run only the accuracy scenario (short_calls.py shares vs py-spy's exact mode)")
    ap.add_argument("--no-accuracy", action="store_true",
                    help="leave the accuracy scenario out of the matrix (the share error column stays empty)")
    ap.add_argument("--memory", action="store_true", help="run the memory scenario (only)")
    ap.add_argument("--memory-secs", type=int, default=60,
                    help="seconds (default 60; 360 at 10 kHz = the 3.6 M samples of 1 h at 1 kHz)")
    ap.add_argument("--memory-rate", type=int, default=10000)
    ap.add_argument("--memory-stacks", type=int, default=10000)
    ap.add_argument("--memory-python", default="3.12")
    ap.add_argument("--scale", action="store_true",
                    help="run only the scale scenarios: many threads (bench/threads_target.py) and a pre-fork "
                         "server under --subprocesses (bench/prefork_target.py); default 3 s per run")
    ap.add_argument("--scale-only", choices=["threads", "processes"], help="with --scale: one of the two scenarios")
    ap.add_argument("--scale-threads", default="10,100,1000",
                    help="thread counts (a one-thread target is always added as the reference)")
    ap.add_argument("--scale-busy", type=int, default=1, help="threads that spin (the rest block)")
    ap.add_argument("--scale-rate", type=int, default=1000)
    ap.add_argument("--scale-workers", type=int, default=16)
    ap.add_argument("--scale-proc-rates", default="100,1000")
    ap.add_argument("--scale-proc-secs", type=float, default=5)
    ap.add_argument("--scale-proc-pythons", default="3.12", help="pythons of the process scenario (of --pythons)")
    ap.add_argument("--wait-load", type=float, metavar="LOAD",
                    help="first wait (30 s polls, up to 15 min) until the 1-minute load is below LOAD")
    ap.add_argument("-o", "--output", help="JSON path (default bench/results/latest.json, --memory: memory.json)")
    ap.add_argument("--keep", action="store_true", help="keep the profiles in the temporary directory")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each row N times and report the run with the median target slowdown")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the target to CPU %d and the profilers to CPU %d" % (TARGET_CPU, PROFILER_CPU))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.accuracy_only and (args.native or args.no_accuracy or args.memory):
        sys.exit("bench: --accuracy-only goes with none of --native, --no-accuracy, --memory")
    if args.no_pin:
        PIN[0] = False
    if PIN[0]:
        os.sched_setaffinity(0, {PROFILER_CPU})
    if args.duration is None:
        args.duration = 2 if args.quick else 3 if args.scale else 5
    if args.rates is None:
        args.rates = "100,1000" if args.native else "1000,10000,1000000"
    if args.duration == int(args.duration):
        args.duration = int(args.duration)

    if not os.access(PYPROF, os.X_OK):
        sys.exit("bench: %s is missing: run `cargo build --release` first" % os.path.relpath(PYPROF))
    if args.wait_load:
        wait_for_load(args.wait_load, 15 * 60)
    meta = machine_meta(args)
    if meta["loadavg_start"][0] > 1.5:
        log("warning: 1-minute load is %.2f on %d CPUs; numbers will be noisy" % (meta["loadavg_start"][0], meta["cpus"]))

    tmp = make_workdir()
    try:
        meta["pyprof_binary"] = snapshot_pyprof(tmp)
        if args.scale:
            meta["duration_per_run"] = args.duration
            meta["scale"] = {k: getattr(args, k) for k in ("scale_threads", "scale_busy", "scale_rate", "scale_workers",
                                                           "scale_proc_rates", "scale_proc_secs", "scale_proc_pythons")}
            rows, proc_rows, worker_rows = scale(args, tmp)
            meta["loadavg_end"] = list(os.getloadavg())
            if rows:
                print("many threads: %d busy, the rest blocked (bench/threads_target.py); CPU (wait4 rusage) and peak RSS "
                      "(VmHWM polled every 50 ms) are the profiler's" % args.scale_busy)
                print(table(rows, THREAD_COLUMNS))
            if proc_rows:
                print("\npre-fork server: %d workers, one replaced every second (bench/prefork_target.py); "
                      "'1st sample ms' = the age of a worker born while sampled at its first sample"
                      % args.scale_workers)
                print(table(proc_rows, PROC_COLUMNS))
            print("\nload average %.2f at start, %.2f at end (1 min); %d CPUs"
                  % (meta["loadavg_start"][0], meta["loadavg_end"][0], meta["cpus"]))
            doc = {"meta": meta, "threads": rows, "processes": proc_rows, "workers": worker_rows}
            path = args.output or os.path.join(BENCH, "results", "scale.json")
        elif args.memory:
            res = memory(args, tmp)
            meta["loadavg_end"] = list(os.getloadavg())
            print("pyprof memory scenario: python %s, %d Hz for %s s, %d distinct stacks requested"
                  % (res["python"], res["rate"], res["duration_requested"], args.memory_stacks))
            for k in ["samples", "achieved_hz", "late", "distinct_stacks", "distinct_function_stacks",
                      "peak_rss_kb_maxrss", "peak_rss_kb_vmhwm", "rss_kb_after_1s", "rss_kb_last", "output_bytes", "cpu_us_per_sample"]:
                v = res[k]
                print("  %-26s %s" % (k, ("%.1f" % v) if isinstance(v, float) else v))
            doc = {"meta": meta, "memory": res}
            path = args.output or os.path.join(BENCH, "results", "memory.json")
        else:
            meta["duration_per_run"] = args.duration
            rows, acc = matrix(args, tmp)
            meta["loadavg_end"] = list(os.getloadavg())
            if rows:
                print(table(rows))
            if acc:
                print("%saccuracy on tests/scripts/short_calls.py (leaf shares; share error = the largest "
                      "|share - reference| of loop/g/f, in percentage points)" % ("\n" if rows else ""))
                print(accuracy_table(acc))
            print("\nload average %.2f at start, %.2f at end (1 min); %d CPUs"
                  % (meta["loadavg_start"][0], meta["loadavg_end"][0], meta["cpus"]))
            doc = {"meta": meta, "results": rows, "accuracy": acc}
            default = "native.json" if args.native else "latest-accuracy.json" if args.accuracy_only else "latest.json"
            path = args.output or os.path.join(BENCH, "results", default)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(clean_json(doc), f, indent=1, ensure_ascii=False)
            f.write("\n")
        log("wrote %s" % os.path.relpath(path))
    finally:
        remove_workdir(tmp, args.keep)


if __name__ == "__main__":
    main()
