#!/usr/bin/env python3
"""SIGKILL pyprof at any instant and check the target goes on untouched.

    python3 bench/kill_anywhere.py                       # 7 commands x 4 pythons, 20 kills each: 560
    python3 bench/kill_anywhere.py --kills 5 --aimed 2 --pythons pyenv-3.12,sid-3.15
    python3 bench/kill_anywhere.py --python pyenv-3.12=/path/to/python3.12 --python sid-3.15=/root/.cache/pyprof/sid/usr/bin/python3.15@/root/.cache/pyprof/sid

One tests/scripts/steady_work.py target per (python, command): three threads
adding up work units, one waking every millisecond, handlers counting SIGTRAP
and SIGCONT. Against it pyprof runs COMMAND again and again, and each run is
SIGKILLed:
- uniform kills at an instant drawn uniformly over the command's own run
  (its length measured first, by one run left to end on its own);
- aimed kills (--aimed) after a uniform delay, at the first instant a poll
  of /proc/PID/task/*/stat finds a thread in a ptrace stop ('t'), so that
  more kills land while pyprof holds a thread.
Just before each kill the target's thread states are read: a 't' counts the
kill as landed during a stop. After pyprof is reaped, within one second,
every thread must be out of any stop ('t' or 'T'), have TracerPid 0 and no
pending signal (SigPnd, ShdPnd), and the target must still run. At the end
the target is told to finish (SIGUSR1): it must exit 0 with the sums its
units should give (checked in closed form), having seen no SIGTRAP and no
SIGCONT. Failures are listed; the exit status is 1 if there is any.

Needs target/release/pyprof (or --pyprof), root or ptrace rights over the
targets; interpreters as tests/common finds them (pyenv under $PYENV_ROOT,
/usr/bin/python3.11, the sid chroot under $PYPROF_CACHE), or given with
--python LABEL=EXE[@CHROOT].
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from children import die_with_parent

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "tests", "scripts", "steady_work.py")
CACHE = os.environ.get("PYPROF_CACHE", os.path.expanduser("~/.cache/pyprof"))
PYENV_ROOT = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))

# name -> pyprof arguments; {pid}, {secs} and {out} are filled in. The
# stopping sampler is named: it is the one whose stops a kill may land in.
# The kernel sampler stops nothing; a kill of it must leave nothing behind.
COMMANDS = {
    "record-1k": "record --sampler ptrace --pid {pid} -r 1000 -d {secs} -q -o {out}/p.json",
    "record-10k": "record --sampler ptrace --pid {pid} -r 10000 -d {secs} -q -o {out}/p.json",
    "record-kernel": "record --sampler kernel --pid {pid} -r 10000 -d {secs} -q -o {out}/p.json",
    "record-native": "record --native --pid {pid} -r 1000 -d {secs} -q -o {out}/p.json",
    "top": "top --sampler ptrace --pid {pid} -r 1000 -d {secs} --refresh 0.1",
    "agent": "agent --pid {pid} -r 1000 --max-cpu 100% --listen 127.0.0.1:0 -d {secs}",
    "dump": "dump --pid {pid}",
    "dump-native": "dump --native --pid {pid}",
}
# Never stops a thread: a kill aimed at a stop would wait for one in vain.
NEVER_STOPS = {"record-kernel"}


def find_pythons(labels):
    """label -> (exe on the host, chroot root or None), as tests/common/mod.rs finds them."""
    found = {}
    for minor in range(8, 14):
        hits = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", "3.%d.*" % minor, "bin", "python3.%d" % minor)))
        if hits:
            found["pyenv-3.%d" % minor] = (hits[-1], None)
    if os.path.exists("/usr/bin/python3.11"):
        found["debian-static-3.11"] = ("/usr/bin/python3.11", None)
    sid = os.path.join(CACHE, "sid")
    for minor in (13, 14, 15):
        exe = os.path.join(sid, "usr", "bin", "python3.%d" % minor)
        if os.path.exists(exe):
            found["sid-3.%d" % minor] = (exe, sid)
    missing = [l for l in labels if l not in found]
    if missing:
        sys.exit("kill_anywhere: no interpreter %s (scripts/setup-fixtures.sh installs them)" % ", ".join(missing))
    return {l: found[l] for l in labels}


def target_argv(exe, chroot):
    if chroot is None:
        return [exe, SCRIPT]
    inner = "/tmp/pyprof-kill-anywhere"
    os.makedirs(chroot + inner, exist_ok=True)
    shutil.copy(SCRIPT, chroot + inner + "/steady_work.py")
    return ["chroot", chroot, "/" + os.path.relpath(exe, chroot), inner + "/steady_work.py"]


def proc_tasks(pid):
    try:
        return [int(t) for t in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return []


def task_state(pid, tid):
    try:
        with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def task_status(pid, tid):
    try:
        with open("/proc/%d/task/%d/status" % (pid, tid)) as f:
            return dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
    except OSError:
        return {}


def any_ptrace_stop(pid):
    return any(task_state(pid, t) == "t" for t in proc_tasks(pid))


def what_is_wrong(pid):
    """Why the target is not as it was, or None: one look at every thread."""
    tasks = proc_tasks(pid)
    if not tasks:
        return "target gone"
    for tid in tasks:
        state = task_state(pid, tid)
        status = task_status(pid, tid)
        if state is None or not status:
            continue  # exited since listed
        if state in ("t", "T"):
            return "thread %d left in state %s" % (tid, state)
        if status.get("TracerPid", "0").strip() != "0":
            return "thread %d traced by %s" % (tid, status["TracerPid"].strip())
        for mask in ("SigPnd", "ShdPnd"):
            if int(status.get(mask, "0").strip(), 16):
                return "thread %d has %s %s" % (tid, mask, status[mask].strip())
    return None


def check_after(pid):
    """(failure or None, whether it took more than the first look)."""
    wrong = what_is_wrong(pid)
    if wrong is None:
        return None, False
    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        time.sleep(0.01)
        if what_is_wrong(pid) is None:
            return None, True
    return wrong, True


class Target:
    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_parent())
        first = self.proc.stdout.readline()
        if not first.startswith("ready"):
            raise RuntimeError("target did not start: %r" % first)
        self.pid = self.proc.pid
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def handled(self, since):
        """Lines its signal handlers printed after the first `since` lines."""
        return [l for l in self.lines[since:] if l.split(" ")[0] in ("trap", "cont")]

    def finish(self):
        """Failure or None: the target's own work came out right."""
        if self.proc.poll() is not None:
            return "target exited early with %s" % self.proc.returncode
        os.kill(self.pid, signal.SIGUSR1)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "target did not finish within 60 s of SIGUSR1"
        self.reader.join(5)
        if self.proc.returncode != 0:
            return "target exited with %s" % self.proc.returncode
        try:
            result = json.loads(self.lines[-1])
        except (ValueError, IndexError):
            return "target printed no result: %r" % self.lines[-3:]
        # SIGTRAPs already put down to a kill are not counted twice.
        traps = sum(1 for l in self.lines if l.startswith("trap "))
        return result_is_wrong(result, expect_trap=traps, expect_cont=0)


def result_is_wrong(result, expect_trap, expect_cont):
    for k, (n, total) in result["threads"].items():
        k = int(k)
        want = n * (120 * 1000003 * k + 2380) + 120 * 97 * n * (n - 1) // 2
        if total != want or n <= 0:
            return "thread %d: %d units summed to %d, not %d" % (k, n, total, want)
    if result["trap"] != expect_trap or result["cont"] != expect_cont:
        return "handlers saw %d SIGTRAP and %d SIGCONT, not %d and %d" % (result["trap"], result["cont"], expect_trap, expect_cont)
    return None


def run_pyprof(argv, logf):
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf)


def one_kill(argv, pid, at, aimed, logf):
    """Returns (outcome, landed during a stop): outcome 'killed' or 'ended first'."""
    start = time.monotonic()
    p = run_pyprof(argv, logf)
    stop_seen = False
    while True:
        now = time.monotonic()
        if p.poll() is not None:
            return "ended first", False
        if now - start >= at:
            if not aimed:
                break
            stop_seen = any_ptrace_stop(pid)
            if stop_seen:
                break
            continue
        if at - (now - start) > 0.002:
            time.sleep(min(0.001, at - (now - start) - 0.001))
    if not aimed:
        stop_seen = any_ptrace_stop(pid)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    if p.returncode != -signal.SIGKILL:
        # It ended on its own between the look and the kill.
        return "ended first", False
    return "killed", stop_seen


def measure(argv, logf):
    start = time.monotonic()
    p = run_pyprof(argv, logf)
    rc = p.wait(timeout=120)
    return time.monotonic() - start, rc


def run_case(pyprof, label, exe, chroot, name, args, rng, tmp):
    row = {"python": label, "command": name, "uniform": 0, "uniform_in_stop": 0, "aimed": 0, "aimed_in_stop": 0,
           "ended_first": 0, "late_release": 0, "sigtrap": 0, "failures": []}
    target = Target(target_argv(exe, chroot))
    out = tempfile.mkdtemp(dir=tmp)
    argv = [pyprof] + COMMANDS[name].format(pid=target.pid, secs=args.secs, out=out).split()
    logf = open(os.path.join(out, "pyprof.log"), "ab")
    try:
        length, rc = measure(argv, logf)
        if rc != 0:
            row["failures"].append("unkilled run exited %s (log: %s)" % (rc, logf.name))
            return row
        row["run_secs"] = round(length, 3)
        aimed_kills = 0 if name in NEVER_STOPS else args.aimed
        plan = [False] * (args.kills + args.aimed - aimed_kills) + [True] * aimed_kills
        rng.shuffle(plan)
        for aimed in plan:
            # Aimed kills wait a uniform delay over the first 80 % of the run, then for a stop.
            at = rng.uniform(0, length * (0.8 if aimed else 1.0))
            for _ in range(5):
                outcome, in_stop = one_kill(argv, target.pid, at, aimed, logf)
                if outcome == "killed":
                    break
                row["ended_first"] += 1
                at = rng.uniform(0, at)
            else:
                continue
            kind = "aimed" if aimed else "uniform"
            row[kind] += 1
            row[kind + "_in_stop"] += in_stop
            seen = len(target.lines)
            wrong, late = check_after(target.pid)
            row["late_release"] += late
            # A stray signal's handler runs within the target's 50 ms wait.
            time.sleep(0.06)
            handled = target.handled(seen)
            if not wrong and handled and all(l.startswith("trap ") for l in handled):
                # A thread let go with a step armed, when pyprof single-stepped
                # (docs/performance.md): counted apart, to tell it from others.
                row["sigtrap"] += 1
                row["failures"].append("%s kill at %.4f s: stray SIGTRAP (%s)" % (kind, at, ", ".join(handled)))
            elif not wrong and handled:
                wrong = "the target's handlers then saw: %s" % ", ".join(handled)
            if wrong:
                row["failures"].append("%s kill at %.4f s: %s" % (kind, at, wrong))
                if "gone" in wrong:
                    break
    finally:
        logf.close()
        wrong = target.finish()
        if wrong:
            row["failures"].append(wrong)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pyprof", default=os.path.join(ROOT, "target", "release", "pyprof"))
    ap.add_argument("--pythons", default="pyenv-3.8,pyenv-3.12,debian-static-3.11,sid-3.15",
                    help="labels, as in tests/common (default: %(default)s)")
    ap.add_argument("--python", action="append", default=[], metavar="LABEL=EXE[@CHROOT]",
                    help="an interpreter given directly (repeatable; replaces --pythons)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="of: %s" % ", ".join(COMMANDS))
    ap.add_argument("--kills", type=int, default=20, help="uniform kills per python and command")
    ap.add_argument("--aimed", type=int, default=0, help="aimed kills per python and command")
    ap.add_argument("--secs", type=float, default=0.5, help="-d of record, top and agent")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    if args.python:
        pythons = {}
        for spec in args.python:
            label, _, rest = spec.partition("=")
            exe, _, chroot = rest.partition("@")
            pythons[label] = (exe, chroot or None)
    else:
        pythons = find_pythons([l for l in args.pythons.split(",") if l])
    names = [c for c in args.commands.split(",") if c]
    for c in names:
        if c not in COMMANDS:
            sys.exit("kill_anywhere: no command %r (of %s)" % (c, ", ".join(COMMANDS)))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix="pyprof-kill-anywhere-")
    rows = []
    started = time.time()
    print("seed %d; logs under %s" % (seed, tmp), flush=True)
    for label, (exe, chroot) in pythons.items():
        for name in names:
            row = run_case(args.pyprof, label, exe, chroot, name, args, rng, tmp)
            rows.append(row)
            print("%-20s %-14s uniform %3d (in a stop %3d)  aimed %3d (in a stop %3d)  failures %d%s" % (
                label, name, row["uniform"], row["uniform_in_stop"], row["aimed"], row["aimed_in_stop"],
                len(row["failures"]), "".join("\n    " + f for f in row["failures"])), flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("uniform", "uniform_in_stop", "aimed", "aimed_in_stop", "ended_first", "late_release", "sigtrap")}
    total["failures"] = sum(len(r["failures"]) for r in rows)
    print("total: %d kills (%d uniform, %d of them in a stop; %d aimed, %d in a stop), %d failures (%d of them a stray SIGTRAP), %.0f s" % (
        total["uniform"] + total["aimed"], total["uniform"], total["uniform_in_stop"], total["aimed"],
        total["aimed_in_stop"], total["failures"], total["sigtrap"], time.time() - started), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "command": sys.argv, "rows": rows, "total": total}, f, indent=1)
    if total["failures"] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if total["failures"] else 0)


if __name__ == "__main__":
    main()
