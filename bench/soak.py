#!/usr/bin/env python3
"""Soak `pyprof agent --all-python` over Python processes that come and go.

    python3 bench/soak.py                    # one hour
    python3 bench/soak.py --duration 120     # a smoke run
    python3 bench/soak.py --duration 300 --seed 7 --json /tmp/soak.json

Not a CI test: issue 30 ("never hurt the target") asks that an agent left
running for hours neither grows nor leaves anything behind. For --duration
seconds a churn driver starts 1-2 short-lived targets a second (at most
--max-live at once), each a copy of TARGET below run by one of the host's
interpreters in turn (pyenv's 3.*, Debian's /usr/bin/python3.11; 3.6 and 3.7
are in the rotation too, and must be left alone as unsupported). A target
lives 1-10 s, adding up work units in small function calls on --duty of one
CPU; about a third of them have 100 threads (3 busy, 96 waking every 20-200
ms, the main thread waiting). Every thread's sum is checked in closed form
when it exits, as bench/kill_anywhere.py does.

One agent samples them all: --all-python, --match restricted to this run's
own target file (so other Python processes of the host are not touched),
--listen 127.0.0.1:0 (loopback: no token) for /metrics and a pull now and
then, and --push to a Pyroscope /ingest receiver run here, every --interval.

Checks, each a line of the summary (exit 1 if any failed):
- resources of the agent, read every --sample-every s: VmRSS, VmHWM, open
  fds, perf events (fds reading anon_inode:[perf_event]) and threads, held to
  the bounds in BOUNDS below after a warm-up (5 min, or 1/6 of a shorter
  run); and back to the idle baseline once every target is gone.
- no target hurt: every live target's threads are looked at every
  --check-every s, and one still in a stop ('t', 'T'), traced, or with a
  signal pending after a second of looks is a failure (a stop of the few
  microseconds a sample takes passes); every target must exit 0 by itself
  within --stuck-after s of its end, with the right sums, having seen no
  SIGTRAP or SIGCONT, no later than MAX_OVERRUN s after its lifetime.
- every interval delivered or counted: once the churn stops and the agent
  has pushed the last exited target's interval, /metrics must say offered =
  delivered + dropped with the queue empty, the receiver must have got
  exactly `delivered` profiles, and their samples must add up to
  pyprof_agent_samples_total; every supported target must be in at least
  one push, no unsupported one in any, and the agent must count each
  attached (or ignored as unsupported) exactly once.
- a clean stop: two last targets are running when the agent gets SIGTERM;
  it must exit 0 within STOP_WITHIN s having pushed their last interval, and
  leave them untraced, running, and finishing right.

Writes the time series and every figure to bench/results/soak-DATE.json
(--json), and a summary with the bounds and whether each held to stdout.
Needs target/release/pyprof (or --pyprof) and root (ptrace, perf events).
"""
import argparse
import collections
import glob
import gzip
import http.server
import json
import os
import random
import re
import shutil
import signal
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from children import die_with_parent

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYENV_ROOT = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
NCPU = os.cpu_count() or 1

# Bounds, from what the agent keeps (docs/agent.md "Memory"): no history;
# per live target one push aggregator and its code-object cache; per pull
# in progress one aggregator (this script runs one at a time); the shared
# CPU-wide context-switch tracker (one perf event per CPU) for the whole
# run. So once the warm-up has seen the workload's full variety (up to
# --max-live targets, 100-thread ones among them) nothing should grow with
# the number of targets ever seen, only with the number live.
BOUNDS = {
    # The shared tracker opens at the first sample, not before: the idle
    # baseline (taken with no target yet) has not got it.
    "perf_shared": NCPU,
    # Allocator slack and fragmentation: half again what the warm-up needed,
    # plus about three worst-case aggregators (2.5 MB each, docs/agent.md).
    "rss_factor": 1.5,
    "rss_plus_kib": 8 * 1024,
    # Per live target: one CPU-wide set of context-switch events (one per
    # CPU; only --mode cpu opens them) and a file or two (/proc reads).
    "fds_per_target": NCPU + 2,
    "perf_per_target": NCPU,
    # Connections in progress besides: this script's scrape and pull, the
    # push sender's, and one being closed.
    "fds_http": 4,
    # Threads do not depend on targets at all: the sampler, HTTP, SIGHUP,
    # budget, interval and push threads, plus one per HTTP request served.
    "threads_http": 3,
}
# A target runs its lifetime from its own start; startup and the agent's
# stops (microseconds each) must not make it seconds late on a 2-CPU host.
MAX_OVERRUN = 5.0
# systemd's TimeoutStopSec in docs/agent.md; the agent allows its exporters 3 s.
STOP_WITHIN = 10.0
# Waking threads sleep 20-200 ms: a thread late by more than this was held
# (or starved) longer than any sample or GIL wait should take. Reported.
LATE_WAKE = 1.0

# The target, run by every interpreter from 3.6 on: no syntax newer than 3.6.
TARGET = r'''
import json, os, random, signal, sys, threading, time

ident, lifetime, kind, duty = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
out = sys.argv[5]
start = time.monotonic()
deadline = start + lifetime
seen = {"trap": 0, "cont": 0}
results = {}
late = [0.0]


def count(name):
    def handler(signum, frame):
        seen[name] += 1
    return handler


def leaf(x):
    return 3 * x + 1


def unit(k, i):
    s = 0
    for j in range(40):
        s += leaf(k * 1000003 + i * 97 + j)
    return s


def busy(k, share):
    # Work for 5 ms, then rest so this thread uses `share` of a CPU.
    total, i = 0, 0
    rest = 0.005 * (1.0 - share) / share
    while time.monotonic() < deadline:
        until = time.monotonic() + 0.005
        while time.monotonic() < until:
            for _ in range(8):
                total += unit(k, i)
                i += 1
        time.sleep(rest)
    results[str(k)] = [i, total]


def waker(k, rng):
    total, i = 0, 0
    while True:
        nap = rng.uniform(0.02, 0.2)
        t = time.monotonic()
        time.sleep(nap)
        late[0] = max(late[0], time.monotonic() - t - nap)
        total += unit(k, i)
        i += 1
        if time.monotonic() >= deadline:
            break
    results[str(k)] = [i, total]


signal.signal(signal.SIGTRAP, count("trap"))
signal.signal(signal.SIGCONT, count("cont"))
if kind == "threads":
    rng = random.Random(ident)
    threads = [threading.Thread(target=busy, args=(k, duty / 3)) for k in (1, 2, 3)]
    threads += [threading.Thread(target=waker, args=(k, random.Random(rng.random()))) for k in range(10, 106)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
else:
    busy(0, duty)
doc = {"id": ident, "pid": os.getpid(), "threads": results, "trap": seen["trap"], "cont": seen["cont"],
       "ran": time.monotonic() - start, "late": late[0], "version": "%d.%d.%d" % sys.version_info[:3]}
with open(out + ".tmp", "w") as f:
    json.dump(doc, f)
os.rename(out + ".tmp", out)
'''


def want_sum(k, n):
    """What n units of thread k add up to (see `unit` in TARGET)."""
    return n * (120 * 1000003 * k + 2380) + 11640 * n * (n - 1) // 2


def find_pythons(given):
    """[(label, exe, (major, minor))], pyenv's 3.* then Debian's 3.11, or --python's."""
    exes = given or sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", "3.*", "bin", "python3")),
                           key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("/versions/")[1])[:3]])
    if not given and os.path.exists("/usr/bin/python3.11"):
        exes.append("/usr/bin/python3.11")
    out = []
    for exe in exes:
        try:
            v = subprocess.run([exe, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30, check=True).stdout.decode().strip()
        except (OSError, subprocess.SubprocessError):
            print("soak: skipping %s (does not run)" % exe, flush=True)
            continue
        label = ("debian-" if exe.startswith("/usr/") else "pyenv-") + v
        out.append((label, exe, tuple(int(x) for x in v.split(".")[:2])))
    if not out:
        sys.exit("soak: no interpreter found")
    return out


def supported(version):
    # docs/versions.md: 3.8 to 3.15; older ones are refused.
    return version >= (3, 8)


# ---- /proc -------------------------------------------------------------

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def status_fields(text):
    return dict((k, v.strip()) for k, _, v in (l.partition(":") for l in (text or "").splitlines()))


def proc_tasks(pid):
    try:
        return [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []


def agent_resources(pid):
    """RSS, HWM (KiB), fds, perf events, threads and CPU seconds of the agent."""
    st = status_fields(read("/proc/%d/status" % pid))
    fds = perf = 0
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        names = []
    for name in names:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, name))
        except OSError:
            continue  # closed since listed
        fds += 1
        perf += link == "anon_inode:[perf_event]"
    stat = (read("/proc/%d/stat" % pid) or ")").rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / tick if len(stat) > 12 else None
    return {"rss_kib": int(st.get("VmRSS", "0 kB").split()[0]), "hwm_kib": int(st.get("VmHWM", "0 kB").split()[0]),
            "fds": fds, "perf": perf, "threads": len(proc_tasks(pid)), "cpu_s": cpu}


def what_is_wrong(pid, agent_pid):
    """Why one look at the target finds it hurt, or None: a thread in a stop,
    traced by anyone, or with a signal pending (the harness sends none)."""
    for tid in proc_tasks(pid):
        stat = read("/proc/%d/task/%d/stat" % (pid, tid))
        status = read("/proc/%d/task/%d/status" % (pid, tid))
        if stat is None or status is None:
            continue  # the thread exited since listed
        state = stat.rsplit(")", 1)[1].split()[0]
        f = status_fields(status)
        if state in ("t", "T"):
            return "thread %d in state %s" % (tid, state)
        tracer = f.get("TracerPid", "0")
        if tracer != "0":
            who = "the agent" if agent_pid is not None and tracer == str(agent_pid) else "pid %s" % tracer
            return "thread %d traced by %s" % (tid, who)
        for mask in ("SigPnd", "ShdPnd"):
            if int(f.get(mask, "0"), 16):
                return "thread %d has %s %s" % (tid, mask, f[mask])
    return None


def check_target(pid, agent_pid, patience=1.0):
    """(failure or None, whether the first look saw something): a sample
    stops a thread for microseconds, so only what lasts `patience` s counts."""
    wrong = what_is_wrong(pid, agent_pid)
    if wrong is None:
        return None, False
    until = time.monotonic() + patience
    while time.monotonic() < until:
        time.sleep(0.01)
        if not os.path.exists("/proc/%d" % pid) or what_is_wrong(pid, agent_pid) is None:
            return None, True
    return wrong, True


# ---- pprof, decoded just enough to count samples -------------------------

def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf):
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        kind = key & 7
        if kind == 0:
            v, i = _varint(buf, i)
        elif kind == 2:
            size, i = _varint(buf, i)
            v, i = buf[i:i + size], i + size
        elif kind == 1:
            v, i = buf[i:i + 8], i + 8
        elif kind == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % kind)
        yield key >> 3, kind, v


def pprof_samples(data):
    """Total of the `samples` sample type of a (gzipped) pprof profile."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    buf = memoryview(data)
    types, values, strings = [], [], []
    for field, kind, v in _fields(buf):
        if field == 1 and kind == 2:  # sample_type: ValueType{type, unit}
            types.append(next((x for f, k, x in _fields(v) if f == 1 and k == 0), 0))
        elif field == 2 and kind == 2:  # sample: {location_id, value, label}
            vals = []
            for f, k, x in _fields(v):
                if f == 2 and k == 0:
                    vals.append(x)
                elif f == 2 and k == 2:
                    j = 0
                    while j < len(x):
                        n, j = _varint(x, j)
                        vals.append(n)
            values.append(vals)
        elif field == 6 and kind == 2:
            strings.append(bytes(v).decode("utf-8", "replace"))
    names = [strings[t] if t < len(strings) else "" for t in types]
    if "samples" not in names:
        raise ValueError("no 'samples' sample type in %s" % names)
    at = names.index("samples")
    return sum(v[at] for v in values if len(v) > at)


# ---- the Pyroscope receiver ----------------------------------------------

class Receiver:
    """POST /ingest as Pyroscope takes it: one profile per request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pushes = []  # one small dict per profile received
        self.bad = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self._body()
                url = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(url.query)
                row = {"t": time.time(), "bytes": len(body)}
                try:
                    if url.path != "/ingest":
                        raise ValueError("path %s" % url.path)
                    name = q["name"][0]
                    row["target"] = int(re.search(r"soak_target\.py (\d+)", name).group(1))
                    row["pid"] = int(re.search(r"[{,]pid=(\d+)", name).group(1))
                    row["from"], row["until"] = int(q["from"][0]), int(q["until"][0])
                    row["rate"] = int(q["sampleRate"][0])
                    row["samples"] = pprof_samples(body)
                except Exception as e:  # anything wrong with it is a finding, not a crash
                    with outer.lock:
                        outer.bad.append("%s: %r" % (self.path[:200], e))
                else:
                    with outer.lock:
                        outer.pushes.append(row)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _body(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size + 2)[:size]
                        if size == 0:
                            return out
                        out += chunk
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def log_message(self, *a):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self):
        with self.lock:
            return len(self.pushes)

    def snapshot(self):
        with self.lock:
            return list(self.pushes), list(self.bad)


# ---- the agent -------------------------------------------------------------

def parse_metrics(text):
    """Prometheus text -> {name: {labels-string: value}}."""
    out = collections.defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)][m.group(2) or ""] = float(m.group(3))
    return out


def one(metrics, name, labels=""):
    return metrics.get(name, {}).get(labels, 0.0)


def total(metrics, name):
    return sum(metrics.get(name, {}).values())


class Agent:
    def __init__(self, pyprof, match, push_url, interval, extra, logpath):
        self.argv = [pyprof, "agent", "--all-python", "--match", match, "--listen", "127.0.0.1:0",
                     "--push", push_url, "--interval", "%gs" % interval] + extra
        self.logpath = logpath
        self.log = open(logpath, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        self.pid = self.proc.pid
        self.base = None
        until = time.monotonic() + 15
        while time.monotonic() < until and self.proc.poll() is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", read(logpath) or "")
            if m:
                self.base = m.group(1)
                break
            time.sleep(0.05)
        if self.base is None:
            raise RuntimeError("the agent printed no address (exit %s): %s" % (self.proc.poll(), read(logpath)))

    def metrics(self):
        try:
            with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
                return parse_metrics(r.read().decode())
        except OSError:
            return None

    def pull(self, secs):
        """(HTTP status, samples) of one /debug/pprof/profile request."""
        try:
            with urllib.request.urlopen("%s/debug/pprof/profile?seconds=%d" % (self.base, secs), timeout=secs + 20) as r:
                return r.status, pprof_samples(r.read())
        except urllib.error.HTTPError as e:
            return e.code, None
        except (OSError, ValueError) as e:
            return repr(e), None

    def stderr_lines(self):
        return (read(self.logpath) or "").splitlines()


# ---- the targets -----------------------------------------------------------

class Targets:
    """Starts, watches and reaps the churned processes."""

    def __init__(self, tmp, pythons, args, rng):
        self.tmp, self.pythons, self.args, self.rng = tmp, pythons, args, rng
        self.script = os.path.join(tmp, "soak_target.py")
        with open(self.script, "w") as f:
            f.write(TARGET)
        os.makedirs(os.path.join(tmp, "out"))
        self.live = {}  # id -> row
        self.done = []
        self.next_id = 0
        self.turn = 0
        self.failures = []

    def start(self, lifetime=None, kind=None, python=None):
        label, exe, version = python or self.pythons[self.turn % len(self.pythons)]
        self.turn += python is None
        ident = self.next_id
        self.next_id += 1
        lifetime = lifetime if lifetime is not None else round(self.rng.uniform(1, 10), 2)
        kind = kind or ("threads" if self.rng.random() < self.args.threads_share else "plain")
        out = os.path.join(self.tmp, "out", "%d.json" % ident)
        err = open(out + ".err", "wb")
        argv = [exe, self.script, str(ident), str(lifetime), kind, str(self.args.duty), out]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, preexec_fn=die_with_parent())
        err.close()
        row = {"id": ident, "pid": proc.pid, "python": label, "supported": supported(version), "kind": kind,
               "lifetime": lifetime, "started": time.monotonic(), "wall_started": time.time(), "proc": proc, "out": out}
        self.live[ident] = row
        return row

    def reap(self, agent_pid):
        now = time.monotonic()
        for ident, row in list(self.live.items()):
            rc = row["proc"].poll()
            if rc is None:
                if now > row["started"] + row["lifetime"] + self.args.stuck_after:
                    wrong = what_is_wrong(row["pid"], agent_pid) or "no thread stopped or traced"
                    self.fail(row, "still running %.0f s after its lifetime (%s); killed" % (self.args.stuck_after, wrong))
                    row["proc"].kill()
                    try:
                        # A leader held by a tracer cannot be reaped until it lets
                        # go: waiting without a bound hung a whole soak once.
                        row["proc"].wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        self.fail(row, "not reaped 10 s after SIGKILL (%s)" % (what_is_wrong(row["pid"], agent_pid) or "?"))
                    self.finish(row, None)
                continue
            self.finish(row, rc)

    def finish(self, row, rc):
        del self.live[row["id"]]
        row["ended"] = time.monotonic()
        row["rc"] = rc
        row["overrun"] = row["ended"] - row["started"] - row["lifetime"]
        del row["proc"]
        if rc is not None:
            wrong = self.result_is_wrong(row, rc)
            if wrong:
                self.fail(row, wrong)
            else:
                os.unlink(row["out"] + ".err")
        self.done.append(row)

    def result_is_wrong(self, row, rc):
        if rc != 0:
            return "exited %s: %s" % (rc, (read(row["out"] + ".err") or "").strip()[-300:])
        try:
            with open(row["out"]) as f:
                res = json.load(f)
        except (OSError, ValueError) as e:
            return "no result: %s" % e
        row["ran"], row["late"] = res["ran"], res["late"]
        want = [0] if row["kind"] == "plain" else [1, 2, 3] + list(range(10, 106))
        if sorted(int(k) for k in res["threads"]) != want:
            return "threads reported: %s" % sorted(res["threads"])
        for k, (n, got) in res["threads"].items():
            if n <= 0 or got != want_sum(int(k), n):
                return "thread %s: %d units summed to %d, not %d" % (k, n, got, want_sum(int(k), n))
        if res["trap"] or res["cont"]:
            return "handlers saw %d SIGTRAP and %d SIGCONT" % (res["trap"], res["cont"])
        if row["overrun"] > MAX_OVERRUN:
            return "ended %.1f s after its lifetime of %.1f s (bound %.0f s)" % (row["overrun"], row["lifetime"], MAX_OVERRUN)
        return None

    def fail(self, row, why):
        msg = "target %d (pid %d, %s, %s, %.1f s): %s" % (row["id"], row["pid"], row["python"], row["kind"], row["lifetime"], why)
        self.failures.append(msg)
        print("soak: FAIL " + msg, flush=True)

    def look(self, agent_pid, stats):
        """One look at every live target's threads (see check_target)."""
        for row in list(self.live.values()):
            if row["proc"].poll() is not None:
                continue
            wrong, noticed = check_target(row["pid"], agent_pid)
            stats["looks"] += 1
            stats["transient"] += noticed and not wrong
            if wrong and row["proc"].poll() is None:
                self.fail(row, "hurt while running: " + wrong)

    def kill_all(self):
        for row in list(self.live.values()):
            row["proc"].kill()
            try:
                row["proc"].wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


# ---- summaries ---------------------------------------------------------------

def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def thirds(series, key):
    """min/median/max over the start, middle and end thirds of the run."""
    if not series:
        return {}
    end = series[-1]["t"]
    parts = {"start": [], "middle": [], "end": []}
    for s in series:
        part = "start" if s["t"] < end / 3 else "middle" if s["t"] < 2 * end / 3 else "end"
        parts[part].append(s.get(key))
    return {k: spread(v) for k, v in parts.items()}


def halves(series, key, after):
    """Max over the first and the last half of the samples after the warm-up."""
    rest = [s for s in series if s["t"] >= after]
    if len(rest) < 2:
        return None
    mid = rest[len(rest) // 2]["t"]
    first = max(s[key] for s in rest if s["t"] < mid)
    last = max(s[key] for s in rest if s["t"] >= mid)
    return {"first_half_max": first, "last_half_max": last, "ratio": round(last / first, 3) if first else None}


class Checks:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, detail):
        self.rows.append({"check": name, "ok": bool(ok), "detail": detail})

    def failed(self):
        return [r for r in self.rows if not r["ok"]]


def resource_checks(checks, series, warmup, idle):
    warm = [s for s in series if s["t"] < warmup]
    after = [s for s in series if s["t"] >= warmup]
    if not warm or not after:
        checks.add("resources sampled after the warm-up", False, "%d samples in the warm-up, %d after" % (len(warm), len(after)))
        return {}
    bounds = {}
    for key in ("rss_kib", "hwm_kib"):
        base = max(s[key] for s in warm)
        bound = BOUNDS["rss_factor"] * base + BOUNDS["rss_plus_kib"]
        worst = max(after, key=lambda s: s[key])
        bounds[key] = {"warmup_max": base, "bound": bound, "max_after": worst[key]}
        checks.add("%s <= %.1f x warm-up max (%d KiB) + %d KiB = %d KiB" % (key, BOUNDS["rss_factor"], base, BOUNDS["rss_plus_kib"], bound),
                   worst[key] <= bound, "max %d KiB at %.0f s" % (worst[key], worst["t"]))
    shared = BOUNDS["perf_shared"]
    for key, per, slack in (("fds", BOUNDS["fds_per_target"], BOUNDS["fds_http"] + shared), ("perf", BOUNDS["perf_per_target"], shared),
                            ("threads", 0, BOUNDS["threads_http"])):
        over = [s for s in after if s[key] > idle[key] + slack + per * s["live_max"]]
        worst = max(after, key=lambda s: s[key] - per * s["live_max"])
        bounds[key] = {"idle": idle[key], "per_live_target": per, "slack": slack, "max_after": max(s[key] for s in after)}
        checks.add("%s <= idle %d + %d (connections, shared tracker) + %d per live target" % (key, idle[key], slack, per), not over,
                   "%d samples over; max %d with %d live (at %.0f s)" % (len(over), worst[key], worst["live_max"], worst["t"]))
    return bounds


def fmt(x):
    if isinstance(x, dict):
        return "/".join("%.2f" % v for v in x.values())
    return "-" if x is None else "%.2f" % x


def print_summary(doc, checks):
    print("\n== pyprof agent soak: %.0f s, %d targets (%d supported), seed %d" % (
        doc["ran_secs"], doc["targets"]["started"], doc["targets"]["supported"], doc["seed"]))
    rate = doc["series_summary"].get("rate_hz", {})
    print("agent CPU %.2f%% of one CPU on average; rate in force (min/median/max) %s; %d ticks, %d late, %d snapshots lost" % (
        doc["agent_cpu_percent"] or 0, " then ".join("%.1f/%.1f/%.1f Hz" % (r["min"], r["median"], r["max"]) for r in rate.values() if r),
        doc["agent_counts"]["ticks"], doc["agent_counts"]["late"], doc["agent_counts"]["errors"]))
    t = doc["targets"]
    print("targets: %d 100-thread; overrun after lifetime %s s (p99 %s); latest wake-up %s s" % (
        t["threads_kind"], fmt(t["overrun_secs"]), fmt(t["overrun_p99"]), fmt(t["late_wake_secs"])))
    print("%-9s %-28s %-28s %-28s %s" % ("", "start min/median/max", "middle", "end", "after warm-up: 1st half max -> 2nd"))
    for key in ("rss_kib", "hwm_kib", "fds", "perf", "threads", "live", "agent_targets"):
        cells = []
        for part in ("start", "middle", "end"):
            s = doc["series_summary"].get(key, {}).get(part)
            cells.append("%g / %g / %g" % (s["min"], s["median"], s["max"]) if s else "-")
        h = doc["halves"].get(key)
        tail = "%g -> %g (x%s)" % (h["first_half_max"], h["last_half_max"], h["ratio"]) if h else "-"
        print("%-9s %-28s %-28s %-28s %s" % (key, cells[0], cells[1], cells[2], tail))
    print()
    for r in checks.rows:
        print("%s  %s: %s" % ("ok  " if r["ok"] else "FAIL", r["check"], r["detail"]))
    bad = checks.failed()
    print("\n%s: %d of %d checks failed" % ("FAILED" if bad else "PASSED", len(bad), len(checks.rows)), flush=True)


# ---- the run -----------------------------------------------------------------

def pull_loop(agent, every, secs, stop, pulls):
    while not stop.wait(every):
        status, samples = agent.pull(secs)
        pulls.append({"t": time.time(), "status": status, "samples": samples})


def wait_quiet(agent, receiver, interval, timeout):
    """Waits for every interval to be pushed: no targets, the queue empty,
    offered = delivered + dropped, the receiver caught up, and nothing new
    offered over a whole interval. Returns the last /metrics and whether
    it got there."""
    deadline = time.monotonic() + timeout
    stable_since, last_key, m = None, None, None
    while time.monotonic() < deadline:
        m = agent.metrics()
        if m is not None:
            offered = one(m, "pyprof_push_offered_total", '{exporter="pyroscope"}')
            delivered = one(m, "pyprof_push_delivered_total", '{exporter="pyroscope"}')
            dropped = total(m, "pyprof_push_dropped_total")
            queued = one(m, "pyprof_push_queue_intervals", '{exporter="pyroscope"}')
            key = (offered, delivered, dropped, one(m, "pyprof_agent_samples_total"))
            settled = (one(m, "pyprof_agent_targets") == 0 and queued == 0 and offered == delivered + dropped
                       and receiver.count() >= delivered)
            if settled and key == last_key:
                if time.monotonic() - stable_since >= interval + 1:
                    return m, True
            else:
                stable_since, last_key = time.monotonic(), key if settled else None
        time.sleep(0.5)
    return m, False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pyprof", default=os.path.join(ROOT, "target", "release", "pyprof"))
    ap.add_argument("--duration", type=float, default=3600, help="seconds of churn (default one hour)")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before the bounds apply (default min(300, duration/6))")
    ap.add_argument("--interval", type=float, default=5, help="the agent's --interval, seconds")
    ap.add_argument("--max-live", type=int, default=6, help="targets alive at once, at most (a 2-CPU host)")
    ap.add_argument("--duty", type=float, default=0.2, help="share of one CPU each target works (default %(default)s)")
    ap.add_argument("--threads-share", type=float, default=0.3, help="share of targets with 100 threads")
    ap.add_argument("--sample-every", type=float, default=2, help="seconds between looks at the agent")
    ap.add_argument("--check-every", type=float, default=2, help="seconds between looks at the live targets")
    ap.add_argument("--pull-every", type=float, default=60, help="seconds between pulls of /debug/pprof/profile")
    ap.add_argument("--stuck-after", type=float, default=30, help="a target this late is stuck")
    ap.add_argument("--python", action="append", default=[], metavar="EXE", help="interpreter (repeatable; replaces the found ones)")
    ap.add_argument("--agent-arg", action="append", default=[], help="more agent arguments, e.g. --agent-arg=--max-cpu=5%%")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="default bench/results/soak-DATE.json")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else min(300.0, args.duration / 6)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    json_path = args.json or os.path.join(HERE, "results", "soak-%s.json" % time.strftime("%Y-%m-%d-%H%M"))
    if not os.access(args.pyprof, os.X_OK):
        sys.exit("soak: no %s (cargo build --release)" % args.pyprof)

    pythons = find_pythons(args.python)
    tmp = tempfile.mkdtemp(prefix="pyprof_soak_")
    receiver = Receiver()
    # Only this run's own targets: their script's path is unique to it.
    match = re.escape(os.path.join(tmp, "soak_target.py")).replace("\\/", "/")
    print("soak: seed %d, %.0f s (warm-up %.0f s), pythons %s; work in %s" % (
        seed, args.duration, warmup, ", ".join(p[0] for p in pythons), tmp), flush=True)
    agent = Agent(args.pyprof, match, receiver.url, args.interval, args.agent_arg, os.path.join(tmp, "agent.log"))
    targets = Targets(tmp, pythons, args, rng)
    checks = Checks()
    series, pulls, live_hist = [], [], collections.deque()
    looks = {"looks": 0, "transient": 0}
    stop_pulls = threading.Event()
    t0 = time.monotonic()
    cpu0 = agent_resources(agent.pid)["cpu_s"]
    doc = {"seed": seed, "command": sys.argv, "args": vars(args), "warmup_secs": warmup, "bounds": BOUNDS,
           "max_overrun_secs": MAX_OVERRUN, "agent_argv": agent.argv, "pythons": [p[:2] for p in pythons]}
    try:
        # The idle baseline: the agent with nothing to sample, after its
        # shared tracker opened (at the first tick) and a scrape is done.
        time.sleep(3)
        agent.metrics()
        time.sleep(0.5)
        idle = agent_resources(agent.pid)
        doc["idle"] = idle
        print("soak: agent pid %d at %s; idle: %d KiB, %d fds, %d perf events, %d threads" % (
            agent.pid, agent.base, idle["rss_kib"], idle["fds"], idle["perf"], idle["threads"]), flush=True)
        threading.Thread(target=pull_loop, args=(agent, args.pull_every, 5, stop_pulls, pulls), daemon=True).start()

        start = time.monotonic()
        next_churn = next_sample = next_check = start
        next_report = start + 60
        capped = 0
        while time.monotonic() - start < args.duration:
            now = time.monotonic()
            if agent.proc.poll() is not None:
                checks.add("agent ran throughout", False, "exited %s at %.0f s" % (agent.proc.returncode, now - start))
                break
            targets.reap(agent.pid)
            if now >= next_churn:
                next_churn += 1
                for _ in range(rng.choice((1, 2))):
                    if len(targets.live) < args.max_live:
                        targets.start()
                    else:
                        capped += 1
            live_hist.append((now, len(targets.live)))
            while live_hist and live_hist[0][0] < now - 3:
                live_hist.popleft()
            if now >= next_sample:
                next_sample += args.sample_every
                s = agent_resources(agent.pid)
                m = agent.metrics() or {}
                s.update({
                    "t": round(now - start, 1), "live": len(targets.live), "live_max": max(n for _, n in live_hist),
                    "agent_targets": one(m, "pyprof_agent_targets"), "rate_hz": one(m, "pyprof_agent_rate_hz"),
                    "cpu_ratio": round(one(m, "pyprof_agent_cpu_ratio"), 4), "ticks": one(m, "pyprof_agent_ticks_total"),
                    "late": one(m, "pyprof_agent_late_ticks_total"), "samples": one(m, "pyprof_agent_samples_total"),
                    "errors": total(m, "pyprof_agent_errors_total"), "attached": one(m, "pyprof_agent_targets_attached_total"),
                    "offered": one(m, "pyprof_push_offered_total", '{exporter="pyroscope"}'),
                    "delivered": one(m, "pyprof_push_delivered_total", '{exporter="pyroscope"}'),
                    "dropped": total(m, "pyprof_push_dropped_total"),
                    "queued": one(m, "pyprof_push_queue_intervals", '{exporter="pyroscope"}'),
                    "received": receiver.count(),
                })
                # Fds and perf events are bounded by the targets the agent may
                # still hold: those live now or within the last 3 s, or its own count.
                s["live_max"] = max(s["live_max"], int(s["agent_targets"]))
                series.append(s)
            if now >= next_check:
                next_check += args.check_every
                targets.look(agent.pid, looks)
            if now >= next_report:
                next_report += 60
                s = series[-1]
                print("soak: %4.0f s  %d targets so far, %d live  agent %d KiB (hwm %d), %d fds, %d perf, %d threads, "
                      "%.0f Hz, pushed %d/%d  failures %d" % (
                          s["t"], targets.next_id, s["live"], s["rss_kib"], s["hwm_kib"], s["fds"], s["perf"], s["threads"],
                          s["rate_hz"], s["delivered"], s["offered"], len(targets.failures)), flush=True)
            time.sleep(0.1)
        churn_secs = time.monotonic() - start
        stop_pulls.set()

        # The churn is over: every target ends by itself.
        until = time.monotonic() + 10 + args.stuck_after
        while targets.live and time.monotonic() < until:
            targets.reap(agent.pid)
            time.sleep(0.1)
        targets.reap(agent.pid)

        # Every interval delivered or counted.
        m, quiet = wait_quiet(agent, receiver, args.interval, timeout=60 + 3 * args.interval)
        pushes, bad = receiver.snapshot()
        m = m or {}
        offered = one(m, "pyprof_push_offered_total", '{exporter="pyroscope"}')
        delivered = one(m, "pyprof_push_delivered_total", '{exporter="pyroscope"}')
        dropped = {k: v for k, v in m.get("pyprof_push_dropped_total", {}).items() if v}
        failed_req = {k: v for k, v in m.get("pyprof_push_failed_requests_total", {}).items() if v}
        samples_total = one(m, "pyprof_agent_samples_total")
        pushed_samples = sum(p["samples"] for p in pushes)
        checks.add("the agent's pushes settled (no targets, queue empty)", quiet, "offered %d, delivered %d, dropped %s, queue %d" % (
            offered, delivered, dropped or 0, one(m, "pyprof_push_queue_intervals", '{exporter="pyroscope"}')))
        checks.add("offered = delivered + dropped", offered == delivered + sum(dropped.values()),
                   "%d = %d + %d" % (offered, delivered, sum(dropped.values())))
        checks.add("the receiver got exactly the delivered intervals", len(pushes) == delivered and not bad,
                   "received %d good, %d bad%s; delivered %d" % (len(pushes), len(bad), (": " + bad[0]) if bad else "", delivered))
        checks.add("no interval dropped nor request failed (the receiver never fails)", not dropped and not failed_req,
                   "dropped %s, failed requests %s" % (dropped or 0, failed_req or 0))
        checks.add("pushed samples add up to pyprof_agent_samples_total", pushed_samples == samples_total,
                   "%d pushed, %d counted" % (pushed_samples, samples_total))
        done = targets.done
        sup = [r for r in done if r["supported"]]
        uns = [r for r in done if not r["supported"]]
        pushed_ids = collections.Counter(p["target"] for p in pushes)
        missed = [r["id"] for r in sup if r["id"] not in pushed_ids]
        wrongly = [r["id"] for r in uns if r["id"] in pushed_ids]
        checks.add("every supported target in at least one push", not missed,
                   "%d of %d%s" % (len(sup) - len(missed), len(sup), (", missed ids %s" % missed[:10]) if missed else ""))
        checks.add("no unsupported (3.6, 3.7) target pushed", not wrongly, "%d unsupported started%s" % (
            len(uns), (", pushed ids %s" % wrongly[:10]) if wrongly else ""))
        attached, exited = one(m, "pyprof_agent_targets_attached_total"), one(m, "pyprof_agent_targets_exited_total")
        unsup = one(m, "pyprof_agent_ignored_processes_total", '{reason="unsupported_version"}')
        checks.add("each supported target attached once, and dropped when it exited", attached == len(sup) and exited == attached,
                   "attached %d, exited %d, supported targets %d" % (attached, exited, len(sup)))
        checks.add("each unsupported target ignored once as such", unsup == len(uns),
                   "ignored as unsupported_version %d, unsupported targets %d" % (unsup, len(uns)))
        errors = {k: v for k, v in m.get("pyprof_agent_errors_total", {}).items() if v}

        # Nothing left of the targets in the agent: back to the idle baseline.
        time.sleep(1)
        quiet_res = agent_resources(agent.pid)
        doc["after_churn"] = quiet_res
        shared = BOUNDS["perf_shared"]
        for key, slack in (("fds", 2 + shared), ("perf", shared), ("threads", 1)):
            checks.add("%s back to the idle baseline (+%d) once every target is gone" % (key, slack), quiet_res[key] <= idle[key] + slack,
                       "%d, idle %d" % (quiet_res[key], idle[key]))

        # A clean stop with targets running.
        ok = [p for p in pythons if supported(p[2])] or pythons
        last = [targets.start(lifetime=15, kind="threads", python=rng.choice(ok)),
                targets.start(lifetime=15, kind="plain", python=rng.choice(ok))]
        until = time.monotonic() + 10
        while time.monotonic() < until:
            info = (agent.metrics() or {}).get("pyprof_agent_target_info", {})
            if all(any('pid="%d"' % r["pid"] in k for k in info) for r in last if r["supported"]):
                break
            time.sleep(0.2)
        time.sleep(3)
        before = receiver.count()
        stopped_at = time.time()
        agent.proc.send_signal(signal.SIGTERM)
        try:
            rc = agent.proc.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            rc = "still running"
        took = time.time() - stopped_at
        checks.add("SIGTERM: the agent exits 0 within %.0f s" % STOP_WITHIN, rc == 0, "exit %s after %.1f s" % (rc, took))
        for r in list(targets.live.values()):
            wrong, _ = check_target(r["pid"], None)
            checks.add("target %d (%s, %s) untouched after the agent stopped" % (r["id"], r["python"], r["kind"]), wrong is None,
                       wrong or "no stop, no tracer, no pending signal")
        final_pushes, _ = receiver.snapshot()
        for r in last:
            if not r["supported"]:
                continue
            got = [p for p in final_pushes[before:] if p["target"] == r["id"] and p["until"] >= int(stopped_at)]
            checks.add("target %d's interval in progress at SIGTERM was pushed" % r["id"], got,
                       "%d pushes after SIGTERM, %d of them its own" % (len(final_pushes) - before, len(got)))
        until = time.monotonic() + 15 + args.stuck_after
        while targets.live and time.monotonic() < until:
            targets.reap(None)
            time.sleep(0.1)
        targets.reap(None)
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()

        checks.add("every target exited 0 by itself, with the right sums, no stray signal, on time", not targets.failures,
                   "%d of %d right%s" % (len(targets.done) - len(targets.failures), len(targets.done),
                                         "".join("\n      " + f for f in targets.failures[:20])))
        checks.add("no target found stopped or traced for a second while running", not any("hurt while" in f for f in targets.failures),
                   "%d looks at live targets; %d caught a passing stop, trace or signal" % (looks["looks"], looks["transient"]))
        pull_bad = [p for p in pulls if p["status"] != 200]
        checks.add("every pull answered 200", not pull_bad, "%d pulls%s" % (len(pulls), (", " + str(pull_bad[:3])) if pull_bad else ""))
        lines = agent.stderr_lines()
        # The address, and the one line the CPU budget prints when it first lowers the rate.
        odd = [l for l in lines if "listening on" not in l and "over the CPU budget" not in l]
        checks.add("the agent's stderr holds no warning", not odd, "%d lines%s" % (len(lines), "".join("\n      " + l for l in odd[:10])))
        bounds = resource_checks(checks, series, warmup, idle)

        ran = time.monotonic() - t0
        cpu1 = series[-1]["cpu_s"] if series else cpu0
        overruns = sorted(r["overrun"] for r in done if r.get("rc") == 0)
        lates = sorted(r["late"] for r in done if "late" in r and r["kind"] == "threads")
        by_python = collections.defaultdict(lambda: collections.Counter())
        for r in targets.done:
            c = by_python[r["python"]]
            c["started"] += 1
            c[r["kind"]] += 1
            c["pushes"] += pushed_ids.get(r["id"], 0)
        doc.update({
            "ran_secs": round(ran, 1), "churn_secs": round(churn_secs, 1),
            "agent_cpu_percent": round(100 * (cpu1 - cpu0) / churn_secs, 2) if cpu1 is not None else None,
            "targets": {"started": len(targets.done), "supported": len(sup), "unsupported": len(uns), "capped_starts": capped,
                        "threads_kind": sum(r["kind"] == "threads" for r in targets.done), "by_python": by_python,
                        "overrun_secs": spread(overruns), "overrun_p99": overruns[int(0.99 * (len(overruns) - 1))] if overruns else None,
                        "late_wake_secs": spread(lates), "late_wakes_over_%gs" % LATE_WAKE: sum(l > LATE_WAKE for l in lates),
                        "failures": targets.failures},
            "looks": looks,
            "agent_counts": {"ticks": one(m, "pyprof_agent_ticks_total"), "late": one(m, "pyprof_agent_late_ticks_total"),
                             "errors": total(m, "pyprof_agent_errors_total"), "errors_by_kind": errors,
                             "ignored": m.get("pyprof_agent_ignored_processes_total", {})},
            "push": {"offered": offered, "delivered": delivered, "dropped": dropped, "failed_requests": failed_req,
                     "received": len(pushes), "bad": bad[:20], "pushed_samples": pushed_samples, "samples_total": samples_total,
                     "per_target": spread(list(pushed_ids.values())), "agent_errors": errors},
            "pulls": pulls, "agent_stderr": lines[:50], "resource_bounds": bounds,
            "series_summary": {k: thirds(series, k) for k in ("rss_kib", "hwm_kib", "fds", "perf", "threads", "live", "agent_targets",
                                                             "rate_hz", "cpu_ratio")},
            "halves": {k: halves(series, k, warmup) for k in ("rss_kib", "hwm_kib", "fds", "perf", "threads", "live", "agent_targets")},
            "checks": checks.rows, "series": series,
        })
    finally:
        stop_pulls.set()
        targets.kill_all()
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print_summary(doc, checks)
    print("soak: JSON in %s" % json_path)
    if checks.failed() or args.keep:
        print("soak: logs kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if checks.failed() else 0)


if __name__ == "__main__":
    main()
