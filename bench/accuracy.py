#!/usr/bin/env python3
"""How true are pyprof's sample shares? Measured against exact references.

    python3 bench/accuracy.py                          # all ten interpreters, 3 s per recording
    python3 bench/accuracy.py --pythons pyenv-3.9,sid-3.15 --secs 3 --json out.json
    python3 bench/accuracy.py --scenarios short_calls,time_slices --pyprof PATH

Three scenarios per interpreter (labels as in tests/common: pyenv-3.8 ...
pyenv-3.13, debian-static-3.11, sid-3.13, sid-3.14, sid-3.15):

short_calls   tests/scripts/short_calls.py runs `t += f(g(p))` in `loop`. One
              target process is recorded by py-spy in its default mode (it
              stops the target with ptrace for every sample, so its stacks
              are exact: the reference), then by pyprof at each --rates
              rate, then by py-spy again (the noise floor). Compared: the
              leaf-function shares loop/g/f in %, and the largest absolute
              difference from py-spy run 1's, in percentage points.
              py-spy records at --pyspy-rate (1 kHz): at 10 kHz it falls
              behind (it sustains about 5 kHz here) and only spreads the
              same samples over a longer time.
time_slices   tests/scripts/time_slices.py alternates 20 ms of `long_loop`
              (no calls) and 20 ms of many short calls, so `long_loop` is on
              the stack for 50 % of the wall-clock time; on a loaded machine
              a slice can overrun, so the truth of each recording is the
              target's own account of its slices' wall time (SIGUSR1 before
              and after). Same order of recordings as short_calls. Compared:
              its inclusive share, the error vs that truth in pp, and for pyprof
              the fraction of ticks that became samples ("N samples over M
              ticks" on its stderr; also shown: the ticks whose first read
              was torn and retried, meta.errors.retried of its JSON).
real_code     `python -m test MODULE` for a few of CPython's own CPU-bound
              test modules (--modules; default test_decimal, test_pickle,
              test_difflib), launched under py-spy twice and under pyprof
              twice, all at 1 kHz. Compared: the total variation distance
              TVD = 1/2 sum |p - q| over leaf functions (key: function name
              and file basename) of each run vs py-spy run 1, and the same
              over py-spy run 1's 10 largest leaves with the rest pooled
              ("top10": the long tail of rare leaves is mostly sampling
              noise). py-spy run 2 vs run 1 is the noise floor of two exact
              runs; pyprof run 2 vs run 1 is pyprof's own reproducibility.
              Skipped for an interpreter without its test suite (Debian
              packages libpython3.X-testsuite; scripts/setup-fixtures.sh).

pyprof records in its default wall mode (--real-mode cpu for real_code is
an option), attached with --pid for the first two scenarios and in launch
mode (-- CMD) for the third; its profile is read from its JSON output.
py-spy's raw output is collapsed stacks "func (file:line);...". Needs python3 (stdlib only), root for the sid chroot,
and py-spy from scripts/setup-fixtures.sh (without it only pyprof's numbers,
and time_slices' ground truth, are reported).

Prints one aligned table and writes the rows as JSON (--json). The measure_*
functions are importable (bench/run.py, other harnesses):

    import accuracy
    py = accuracy.find_pythons(["pyenv-3.12"])[0]
    accuracy.measure_short_calls(accuracy.PYPROF, py, secs=3, rate=1000)
"""
import argparse
import collections
import datetime
import glob
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from children import die_with_parent

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
PYPROF = os.path.join(REPO, "target", "release", "pyprof")
SCRIPTS = os.path.join(REPO, "tests", "scripts")
CACHE = os.environ.get("PYPROF_CACHE") or os.path.expanduser("~/.cache/pyprof")
PYSPY = os.path.join(CACHE, "tools", "bin", "py-spy")
SID = os.path.join(CACHE, "sid")
PYENV_ROOT = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")

ALL_PYTHONS = ["pyenv-3.%d" % m for m in range(8, 14)] + ["debian-static-3.11"] + ["sid-3.%d" % m for m in (13, 14, 15)]
# CPU-bound (user time within a few % of wall time on 3.8, 3.11 and 3.15),
# many short Python calls: the pure-Python _pydecimal, pickle's Python
# _Pickler/_Unpickler, difflib's SequenceMatcher. Rejected: test_argparse and
# test_email (file-system work and waits), test_json (43 % of its wall time
# waits for a subprocess), the rest of the usual candidates (test_fractions,
# test_textwrap: under 0.3 s).
DEFAULT_MODULES = ["test_decimal", "test_pickle", "test_difflib"]
SHORT_CALL_FUNCS = ("loop", "g", "f")
TOP_LEAVES = 10     # tvd_top: the reference's 10 largest leaves, the rest pooled
CHROOT_DIR = "/tmp/pyprof-accuracy"   # where scripts are staged inside the chroot
READY_TIMEOUT = 60


def log(msg):
    sys.stderr.write("accuracy: %s\n" % msg)
    sys.stderr.flush()


# --------------------------------------------------------------------------- interpreters


class Python:
    """One interpreter of the matrix. `chroot` is the chroot's root on the host
    (sid interpreters) or None; `exe` is the path the interpreter runs as."""

    def __init__(self, label, exe, chroot=None):
        self.label, self.exe, self.chroot = label, exe, chroot

    def __repr__(self):
        return "Python(%r)" % self.label

    def script(self, name):
        """Path of tests/scripts/NAME as this interpreter sees it (staged
        into the chroot for sid interpreters)."""
        src = os.path.join(SCRIPTS, name)
        if self.chroot is None:
            return src
        dest_dir = os.path.join(self.chroot, CHROOT_DIR.lstrip("/"))
        os.makedirs(dest_dir, exist_ok=True)
        shutil.copy(src, os.path.join(dest_dir, name))
        return CHROOT_DIR + "/" + name

    def argv(self, args):
        """argv that runs `python ARGS` (chroot execs, so the pid is the
        interpreter's)."""
        if self.chroot is None:
            return [self.exe] + list(args)
        return ["chroot", self.chroot, self.exe] + list(args)

    def has_test_suite(self, modules):
        code = "import test.libregrtest, %s" % ", ".join("test." + m for m in modules)
        try:
            r = subprocess.run(self.argv(["-c", code]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0


def find_pythons(labels=None):
    """The interpreters named by `labels` (default: all ten), in matrix order;
    a missing one is skipped with a message."""
    labels = list(labels or ALL_PYTHONS)
    found = []
    for label in labels:
        py = None
        m = re.match(r"^pyenv-3\.(\d+)$", label)
        if m:
            hits = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", "3.%s.*" % m.group(1), "bin",
                                                 "python3.%s" % m.group(1))))
            py = Python(label, hits[-1]) if hits else None
        elif label == "debian-static-3.11":
            py = Python(label, "/usr/bin/python3.11") if os.path.exists("/usr/bin/python3.11") else None
        else:
            m = re.match(r"^sid-3\.(\d+)$", label)
            if m:
                exe = "/usr/bin/python3.%s" % m.group(1)
                if os.path.exists(os.path.join(SID, exe.lstrip("/"))) and os.geteuid() == 0:
                    py = Python(label, exe, chroot=SID)
            else:
                raise SystemExit("accuracy: unknown interpreter label %r (known: %s)" % (label, ", ".join(ALL_PYTHONS)))
        if py is None:
            log("skipping %s: not installed (scripts/setup-fixtures.sh; the sid chroot needs root)" % label)
        else:
            found.append(py)
    return found


def _as_python(py):
    if isinstance(py, Python):
        return py
    found = find_pythons([py])
    if not found:
        raise RuntimeError("interpreter %s is not installed" % py)
    return found[0]


# --------------------------------------------------------------------------- targets


class Target:
    """A running script that prints "ready" once it is in its steady state.
    Use as a context manager: the process is killed and reaped on exit."""

    def __init__(self, py, script, args=()):
        self.py = py
        self.cmd = py.argv([py.script(script)] + [str(a) for a in args])
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent())
        self.pid = self.proc.pid
        self.lines = lines = queue.Queue()

        def pump(stream, sink):
            for raw in stream:
                if sink is not None:
                    sink.put(raw.decode(errors="replace").strip())
        threading.Thread(target=pump, args=(self.proc.stdout, lines), daemon=True).start()
        self._err = queue.Queue()
        threading.Thread(target=pump, args=(self.proc.stderr, self._err), daemon=True).start()
        try:
            first = lines.get(timeout=READY_TIMEOUT)
        except queue.Empty:
            first = None
        if first != "ready":
            self.stop()
            raise RuntimeError("%s: %s did not print ready (got %r; stderr %r)"
                               % (py.label, " ".join(self.cmd), first, self._stderr_text()))

    def _stderr_text(self):
        out = []
        while True:
            try:
                out.append(self._err.get_nowait())
            except queue.Empty:
                return "\n".join(out)[-2000:]

    def alive(self):
        return self.proc.poll() is None

    def split(self):
        """time_slices.py's own account: SIGUSR1 -> (seconds in long_loop,
        seconds in short_calls) so far. Never called while a tool is
        attached (a ptrace-stopped target could lose the signal)."""
        while True:
            try:
                self.lines.get_nowait()
            except queue.Empty:
                break
        for _ in range(5):
            os.kill(self.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if line.startswith("split "):
                    long_s, short_s = line.split()[1:3]
                    return float(long_s), float(short_s)
        raise RuntimeError("%s: time_slices.py does not answer SIGUSR1" % self.py.label)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------- profiles
#
# A profile here is a Counter {stack: samples}, a stack a tuple of (function,
# file) pairs, root first. Line numbers are dropped: both tools agree on them,
# and the comparisons are per function.


def parse_collapsed(path):
    """Collapsed stacks ("frame;frame;... count", each frame "function
    (file:line)" or "function (file)") -> Counter of stacks."""
    stacks = collections.Counter()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            text, count = line.rsplit(" ", 1)
            stacks[tuple(_split_frame(fr) for fr in text.split(";"))] += int(count)
    return stacks


_FRAME = re.compile(r"^(.*?) \((.*?)(?::(\d+))?\)$")


def _split_frame(frame):
    m = _FRAME.match(frame)
    if not m:
        return (frame, "")
    return (m.group(1), m.group(2))


def parse_pyprof_json(path):
    """pyprof's JSON profile -> (Counter of stacks, meta dict)."""
    with open(path) as f:
        doc = json.load(f)
    frames = [(fr["function"], fr["file"]) for fr in doc["frames"]]
    kinds = [fr.get("kind", "python") for fr in doc["frames"]]
    stacks = collections.Counter()
    for s in doc["stacks"]:
        # Only Python frames (no --threads / --subprocesses roots are asked for,
        # no --native frames): what py-spy reports without its options.
        stack = tuple(frames[i] for i in s["frames"] if kinds[i] == "python")
        if stack:
            stacks[stack] += s["count"]
    return stacks, doc.get("meta", {})


def drop_shims(stacks):
    """Remove CPython 3.13+'s `__init__` trampoline frame (function and file
    both "__init__"): the interpreter hides it, py-spy 0.4.3 reports it, pyprof
    does not (see tests/pyspy_oracle.rs)."""
    out = collections.Counter()
    for stack, n in stacks.items():
        kept = tuple(fr for fr in stack if fr != ("__init__", "__init__"))
        if kept:
            out[kept] += n
    return out


def leaf_function_shares(stacks):
    """{function name of the innermost frame: % of samples}."""
    counts = collections.Counter()
    for stack, n in stacks.items():
        counts[stack[-1][0]] += n
    return _percent(counts)


def leaf_shares(stacks):
    """{"function (file basename)" of the innermost frame: % of samples}.
    Basenames, because py-spy shortens paths and pyprof keeps them whole."""
    counts = collections.Counter()
    for stack, n in stacks.items():
        fn, path = stack[-1]
        counts["%s (%s)" % (fn, os.path.basename(path))] += n
    return _percent(counts)


def inclusive_share(stacks, function):
    """% of samples whose stack holds a frame of `function`."""
    total = sum(stacks.values())
    if not total:
        return None
    hit = sum(n for stack, n in stacks.items() if any(fr[0] == function for fr in stack))
    return 100.0 * hit / total


def _percent(counts):
    total = sum(counts.values())
    if not total:
        return {}
    return {k: 100.0 * v / total for k, v in counts.items()}


def tvd(p, q):
    """Total variation distance between two share dicts in % (result in
    [0, 1]): half the sum of the absolute differences."""
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys) / 100.0


def tvd_top(p, ref, n=None):
    """TVD over the `n` (TOP_LEAVES) largest keys of `ref`, every other key
    pooled into one: insensitive to the long tail of rare leaves, whose
    shares are mostly sampling noise, still sensitive to a share moving
    between a short callee and its caller."""
    n = n or TOP_LEAVES
    keys = [k for k, _ in sorted(ref.items(), key=lambda kv: -kv[1])[:n]]

    def pooled(d):
        out = {k: d.get(k, 0.0) for k in keys}
        out[None] = sum(v for k, v in d.items() if k not in out)
        return out
    return tvd(pooled(p), pooled(ref))


def max_abs_diff(p, q, keys):
    return max(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


# --------------------------------------------------------------------------- recorders


def _run(cmd, timeout):
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError("%s timed out after %d s" % (" ".join(cmd[:3]), timeout)) from e
    return r.returncode, r.stdout.decode(errors="replace"), time.monotonic() - t0


def _pyspy_result(cmd, out, timeout):
    rc, text, wall = _run(cmd, timeout)
    if rc != 0 or not os.path.exists(out):
        raise RuntimeError("py-spy failed (exit %s): %s" % (rc, text.strip()[-800:]))
    stacks = drop_shims(parse_collapsed(out))
    m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
    res = {"profiler": "py-spy", "stacks": stacks, "samples": sum(stacks.values()), "wall_secs": round(wall, 2)}
    if m:
        res["errors"] = int(m.group(2))
    behind = re.findall(r"([\d.]+)s behind in sampling", text)
    if behind:
        res["behind_secs"] = float(behind[-1])
    return res


def pyspy_attach(pyspy, pid, secs, rate, out):
    """py-spy in its default (blocking) mode on a running pid."""
    cmd = [pyspy, "record", "--pid", str(pid), "-r", str(rate), "-d", str(secs), "-f", "raw", "-o", out]
    return _pyspy_result(cmd, out, timeout=secs * 10 + 60)


def pyspy_launch(pyspy, argv, rate, out, timeout=600):
    cmd = [pyspy, "record", "-r", str(rate), "-f", "raw", "-o", out, "--"] + list(argv)
    return _pyspy_result(cmd, out, timeout)


def _pyprof_result(cmd, out, timeout):
    rc, text, wall = _run(cmd, timeout)
    if not os.path.exists(out):
        raise RuntimeError("pyprof failed (exit %s): %s" % (rc, text.strip()[-800:]))
    stacks, meta = parse_pyprof_json(out)
    res = {"profiler": "pyprof", "stacks": stacks, "samples": meta.get("samples", sum(stacks.values())),
           "errors": meta.get("errors") or {}, "wall_secs": round(wall, 2), "exit": rc}
    m = re.search(r"(\d+) samples over (\d+) ticks", text)
    if m:
        res["ticks"] = int(m.group(2))
        if res["ticks"]:
            res["ticks_kept_pct"] = 100.0 * int(m.group(1)) / res["ticks"]
    m = re.search(r"([\d.]+) Hz achieved", text)
    if m:
        res["achieved_hz"] = float(m.group(1))
    return res


def pyprof_attach(pyprof, pid, secs, rate, out):
    """pyprof record --pid (wall mode), JSON output; no -q, for the summary."""
    cmd = [pyprof, "record", "--pid", str(pid), "-r", str(rate), "-d", str(secs), "-f", "json", "-o", out]
    return _pyprof_result(cmd, out, timeout=secs * 10 + 60)


def pyprof_launch(pyprof, argv, rate, out, timeout=600, extra=()):
    cmd = [pyprof, "record", "-r", str(rate), "-f", "json", "-o", out] + list(extra) + ["--"] + list(argv)
    return _pyprof_result(cmd, out, timeout)


def _have_pyspy(pyspy):
    return bool(pyspy) and os.access(pyspy, os.X_OK)


def _public(res, **extra):
    """A recorder result without its stacks, plus `extra`."""
    row = {k: v for k, v in res.items() if k != "stacks"}
    row.update(extra)
    return row


def _workdir(workdir):
    return workdir or tempfile.mkdtemp(prefix="pyprof-accuracy-")


# --------------------------------------------------------------------------- scenarios


def measure_short_calls(pyprof, py, secs=3, rate=1000, more_rates=(), pyspy=PYSPY, pyspy_rate=1000, workdir=None,
                        pyspy_runs=2):
    """Leaf shares loop/g/f of tests/scripts/short_calls.py.

    One target process: py-spy (default mode, `pyspy_rate`) for `secs`, then
    pyprof at `rate` and at each of `more_rates`, then py-spy again
    (`pyspy_runs` in all), so two exact runs bracket pyprof's. Returns
    {"python", "scenario", "reference": py-spy run 1 or None, "pyspy_runs":
    [py-spy runs 2..], "runs": [pyprof runs]}; each has "shares" {loop, g, f:
    %}, "samples", and all but the reference "max_err_pp" (vs py-spy run 1;
    for py-spy run 2 that is the noise floor); pyprof runs also "ticks" and
    "ticks_kept_pct"."""
    py = _as_python(py)
    wd = _workdir(workdir)
    result = {"python": py.label, "scenario": "short_calls", "secs": secs, "reference": None, "pyspy_runs": [],
              "runs": []}
    tag = "%s-short" % py.label

    def shares_of(res):
        shares = leaf_function_shares(res["stacks"])
        return _pick(shares, SHORT_CALL_FUNCS), _other(shares, SHORT_CALL_FUNCS)

    def with_error(run):
        if result["reference"]:
            run["max_err_pp"] = max_abs_diff(run["shares"], result["reference"]["shares"], SHORT_CALL_FUNCS)
        return run

    def spy(i):
        res = pyspy_attach(pyspy, target.pid, secs, pyspy_rate, os.path.join(wd, "%s-pyspy%d.txt" % (tag, i)))
        shares, other = shares_of(res)
        return _public(res, rate=pyspy_rate, run=i, shares=shares, other_pct=other)

    with Target(py, "short_calls.py") as target:
        if _have_pyspy(pyspy) and pyspy_runs > 0:
            result["reference"] = spy(1)
        for r in [rate] + [x for x in more_rates if x != rate]:
            if not target.alive():
                raise RuntimeError("%s: short_calls.py exited" % py.label)
            res = pyprof_attach(pyprof, target.pid, secs, r, os.path.join(wd, "%s-pyprof-%d.json" % (tag, r)))
            shares, other = shares_of(res)
            result["runs"].append(with_error(_public(res, rate=r, shares=shares, other_pct=other)))
        if _have_pyspy(pyspy):
            for i in range(2, pyspy_runs + 1):
                result["pyspy_runs"].append(with_error(spy(i)))
    return result


def measure_time_slices(pyprof, py, secs=3, rate=1000, more_rates=(), pyspy=PYSPY, pyspy_rate=1000, workdir=None,
                        pyspy_runs=2):
    """Inclusive share of `long_loop` in tests/scripts/time_slices.py.

    The truth is 50 % by design, but on a loaded machine a slice whose
    process is not scheduled overruns its deadline, so each recording's
    truth is the target's own account of the wall time spent in each kind
    of slice (asked before and after the recording, SIGUSR1). Same order as
    measure_short_calls (py-spy, pyprof at each rate, py-spy again), on one
    target process. Each run has "long_loop_pct", "truth_pct", "err_pp"
    (vs truth), "err_vs_50_pp" and "samples"; pyprof's runs also "ticks"
    and "ticks_kept_pct"."""
    py = _as_python(py)
    wd = _workdir(workdir)
    result = {"python": py.label, "scenario": "time_slices", "secs": secs, "reference": None, "pyspy_runs": [],
              "runs": []}
    tag = "%s-slices" % py.label

    def measured(record, **extra):
        before = target.split()
        res = record()
        after = target.split()
        d_long, d_short = after[0] - before[0], after[1] - before[1]
        truth = 100.0 * d_long / (d_long + d_short) if d_long + d_short > 0 else None
        share = inclusive_share(res["stacks"], "long_loop")
        return _public(res, long_loop_pct=share, truth_pct=truth,
                       err_pp=None if share is None or truth is None else share - truth,
                       err_vs_50_pp=None if share is None else share - 50.0, **extra)

    def spy(i):
        out = os.path.join(wd, "%s-pyspy%d.txt" % (tag, i))
        return measured(lambda: pyspy_attach(pyspy, target.pid, secs, pyspy_rate, out), rate=pyspy_rate, run=i)

    with Target(py, "time_slices.py") as target:
        if _have_pyspy(pyspy) and pyspy_runs > 0:
            result["reference"] = spy(1)
        for r in [rate] + [x for x in more_rates if x != rate]:
            if not target.alive():
                raise RuntimeError("%s: time_slices.py exited" % py.label)
            out = os.path.join(wd, "%s-pyprof-%d.json" % (tag, r))
            result["runs"].append(measured(lambda: pyprof_attach(pyprof, target.pid, secs, r, out), rate=r))
        if _have_pyspy(pyspy):
            for i in range(2, pyspy_runs + 1):
                result["pyspy_runs"].append(spy(i))
    return result


def measure_real_code(pyprof, py, module, rate=1000, pyspy=PYSPY, pyspy_runs=2, pyprof_runs=2, mode="wall",
                      workdir=None, timeout=600):
    """`python -m test MODULE` launched under py-spy (`pyspy_runs` times,
    default mode) and under pyprof (`pyprof_runs` times, `--mode mode`), all
    at `rate`. Leaf shares are per "function (file basename)".

    pyprof's mode defaults to wall, what users get. py-spy's default drops
    the samples of idle threads, so a module that waits (for a subprocess,
    the disk) differs by its waits alone: pick CPU-bound modules, or pass
    mode="cpu" (which counts a thread only while /proc says R).

    Returns {"python", "scenario": "real_code", "module", "reference" (py-spy
    run 1), "pyspy_runs": [py-spy runs 2..], "runs": [pyprof runs]}; every
    run but the reference has "tvd" (vs py-spy run 1) and "tvd_top" (the same
    over py-spy run 1's TOP_LEAVES leaves, the rest pooled as one); pyprof
    runs 2.. also "tvd_pyprof"/"tvd_top_pyprof" vs pyprof run 1."""
    py = _as_python(py)
    wd = _workdir(workdir)
    argv = py.argv(["-m", "test", module])
    tag = "%s-%s" % (py.label, module)
    result = {"python": py.label, "scenario": "real_code", "module": module, "pyprof_mode": mode,
              "reference": None, "pyspy_runs": [], "runs": []}
    ref = None
    if _have_pyspy(pyspy):
        for i in range(pyspy_runs):
            res = pyspy_launch(pyspy, argv, rate, os.path.join(wd, "%s-pyspy%d.txt" % (tag, i + 1)), timeout)
            shares = leaf_shares(res["stacks"])
            run = _public(res, rate=rate, run=i + 1, leaves=len(shares), top=_top(shares))
            if ref is None:
                ref = shares
                result["reference"] = run
            else:
                run["tvd"], run["tvd_top"] = tvd(shares, ref), tvd_top(shares, ref)
                result["pyspy_runs"].append(run)
    first = None
    for i in range(pyprof_runs):
        out = os.path.join(wd, "%s-pyprof%d.json" % (tag, i + 1))
        res = pyprof_launch(pyprof, argv, rate, out, timeout, extra=["--mode", mode])
        shares = leaf_shares(res["stacks"])
        run = _public(res, rate=rate, run=i + 1, mode=mode, leaves=len(shares), top=_top(shares))
        if ref is not None:
            run["tvd"], run["tvd_top"] = tvd(shares, ref), tvd_top(shares, ref)
        if first is None:
            first = shares
        else:
            run["tvd_pyprof"], run["tvd_top_pyprof"] = tvd(shares, first), tvd_top(shares, first)
        result["runs"].append(run)
    return result


def _pick(shares, keys):
    return {k: shares.get(k, 0.0) for k in keys}


def _other(shares, keys):
    return sum(v for k, v in shares.items() if k not in keys)


def _top(shares, n=5):
    return [[k, round(v, 2)] for k, v in sorted(shares.items(), key=lambda kv: -kv[1])[:n]]


# --------------------------------------------------------------------------- report


def rows_of(result):
    """Flatten one measure_* result into table/JSON rows (one per recording)."""
    rows = []
    base = {"python": result["python"], "scenario": result["scenario"]}
    if result["scenario"] == "real_code":
        base["scenario"] = "real_code:" + result["module"]
    recs = []
    if result.get("reference"):
        recs.append(("py-spy", result["reference"]))
    for r in result.get("pyspy_runs", []):
        recs.append(("py-spy#%d" % r["run"], r))
    for r in result["runs"]:
        recs.append(("pyprof#%d" % r["run"] if r.get("run", 1) > 1 else "pyprof", r))
    for name, r in recs:
        row = dict(base)
        row["profiler"] = name
        row.update({k: v for k, v in r.items() if k not in ("profiler", "run")})
        rows.append(row)
    return rows


def _fmt_rate(r):
    return "%dk" % (r // 1000) if r % 1000 == 0 else str(r)


def _fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def format_table(rows):
    head = ["python", "scenario", "profiler", "rate", "result", "error", "samples", "ticks kept (pyprof)"]
    out = []
    for r in rows:
        if "error" in r and isinstance(r["error"], str):
            out.append([r["python"], r["scenario"], r.get("profiler", "-"), "-", "FAILED: " + r["error"][:80], "", "", ""])
            continue
        if r["scenario"] == "short_calls":
            result = "loop/g/f " + "/".join("%.1f" % r["shares"][k] for k in SHORT_CALL_FUNCS)
            error = ("max %.1f pp" % r["max_err_pp"]) if "max_err_pp" in r else "(reference)" if r["profiler"] == "py-spy" else "-"
        elif r["scenario"] == "time_slices":
            result = "long_loop %s %% (truth %s)" % (_fmt(r["long_loop_pct"]), _fmt(r.get("truth_pct")))
            error = "%s pp" % _fmt(r["err_pp"], "%+.1f")
        else:
            result = "top " + ", ".join("%s %.0f%%" % (k.split(" (")[0], v) for k, v in r["top"][:2])
            if "tvd" in r:
                error = "TVD %.3f top%d %.3f" % (r["tvd"], TOP_LEAVES, r["tvd_top"])
                if "tvd_pyprof" in r:
                    error += " (vs pyprof %.3f/%.3f)" % (r["tvd_pyprof"], r["tvd_top_pyprof"])
            else:
                error = "(reference)"
        kept = ("%.1f%% of %d" % (r["ticks_kept_pct"], r["ticks"])) if "ticks_kept_pct" in r else "-"
        retried = (r.get("errors") or {}).get("retried") if isinstance(r.get("errors"), dict) else None
        if retried and r.get("ticks"):
            kept += ", %.0f%% retried" % (100.0 * retried / r["ticks"])
        out.append([r["python"], r["scenario"], r["profiler"], _fmt_rate(r["rate"]), result, error,
                    str(r["samples"]), kept])
    widths = [max(len(x[i]) for x in [head] + out) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for x in out:
        lines.append("  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip())
    return "\n".join(lines)


def _round(obj):
    if isinstance(obj, float):
        return round(obj, 3)
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v) for v in obj]
    return obj


def _pyprof_version(pyprof):
    try:
        return subprocess.run([pyprof, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=10).stdout.decode().strip()
    except (OSError, subprocess.TimeoutExpired):
        return None


def _git_head():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=10).stdout.decode().strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pyprof", default=PYPROF, help="pyprof binary (default target/release/pyprof)")
    ap.add_argument("--pyspy", default=PYSPY, help="py-spy binary (default: the one of scripts/setup-fixtures.sh)")
    ap.add_argument("--pythons", default=",".join(ALL_PYTHONS), help="comma list of interpreter labels")
    ap.add_argument("--secs", type=float, default=3, help="seconds per attached recording (default 3)")
    ap.add_argument("--rates", default="1000,10000", help="pyprof rates, comma list (default 1000,10000)")
    ap.add_argument("--pyspy-rate", type=int, default=1000, help="py-spy's rate (default 1000; it sustains about 5k)")
    ap.add_argument("--scenarios", default="short_calls,time_slices,real_code")
    ap.add_argument("--modules", default=",".join(DEFAULT_MODULES), help="test modules for real_code")
    ap.add_argument("--real-rate", type=int, default=1000, help="rate of both tools for real_code (default 1000)")
    ap.add_argument("--real-mode", default="wall", choices=["wall", "cpu"],
                    help="pyprof's --mode for real_code (default wall; cpu to leave waits out as py-spy does)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the profiles (their directory is printed)")
    args = ap.parse_args()

    if not os.access(args.pyprof, os.X_OK):
        sys.exit("accuracy: %s is not an executable (cargo build --release)" % args.pyprof)
    if not _have_pyspy(args.pyspy):
        log("py-spy not found at %s: no reference, pyprof numbers only" % args.pyspy)
    secs = int(args.secs) if args.secs == int(args.secs) else args.secs
    rates = [int(float(r[:-1]) * 1000) if r.endswith("k") else int(r) for r in args.rates.split(",") if r]
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in scenarios:
        if s not in ("short_calls", "time_slices", "real_code"):
            sys.exit("accuracy: unknown scenario %r" % s)
    modules = [m for m in args.modules.split(",") if m]
    pythons = find_pythons([p for p in args.pythons.split(",") if p])
    if os.getloadavg()[0] > 1.5:
        log("warning: 1-minute load is %.2f on %d CPUs; numbers will be noisy" % (os.getloadavg()[0], os.cpu_count()))

    wd = tempfile.mkdtemp(prefix="pyprof-accuracy-")
    rows = []
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        for py in pythons:
            jobs = []
            if "short_calls" in scenarios:
                jobs.append(("short_calls", lambda: measure_short_calls(
                    args.pyprof, py, secs, rates[0], rates[1:], args.pyspy, args.pyspy_rate, wd)))
            if "time_slices" in scenarios:
                jobs.append(("time_slices", lambda: measure_time_slices(
                    args.pyprof, py, secs, rates[0], rates[1:], args.pyspy, args.pyspy_rate, wd)))
            if "real_code" in scenarios:
                if py.has_test_suite(modules):
                    for m in modules:
                        jobs.append(("real_code:" + m, lambda m=m: measure_real_code(
                            args.pyprof, py, m, args.real_rate, args.pyspy, 2, 2, args.real_mode, wd)))
                else:
                    log("%s: no test suite with %s (Debian: libpython3.X-testsuite); real_code skipped"
                        % (py.label, ", ".join(modules)))
                    rows.append({"python": py.label, "scenario": "real_code", "error": "test suite not installed"})
            for name, job in jobs:
                log("%s: %s" % (py.label, name))
                try:
                    new = rows_of(job())
                except Exception as e:  # one failure must not lose the other rows
                    log("%s: %s failed: %s" % (py.label, name, e))
                    new = [{"python": py.label, "scenario": name, "error": str(e)}]
                rows.extend(new)
                print(format_table(new).split("\n", 2)[-1], flush=True)
    finally:
        if args.keep:
            log("profiles kept in %s" % wd)
        else:
            shutil.rmtree(wd, ignore_errors=True)

    print()
    print(format_table(rows))
    if args.json:
        doc = {"meta": {"started": started, "pyprof": os.path.abspath(args.pyprof),
                        "pyprof_version": _pyprof_version(args.pyprof), "git_head": _git_head(),
                        "pyspy": args.pyspy if _have_pyspy(args.pyspy) else None, "secs": secs,
                        "pyprof_rates": rates, "pyspy_rate": args.pyspy_rate, "real_rate": args.real_rate, "real_mode": args.real_mode,
                        "modules": modules, "cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg())},
               "rows": _round(rows)}
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        log("wrote %s" % args.json)


if __name__ == "__main__":
    main()
