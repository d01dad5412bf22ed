#!/usr/bin/env python3
"""What `pyprof agent` costs the processes it samples: N spinning Python
processes (16 by default) count their own work over the same seconds, with
no agent, with the agent on the kernel sampler and with it on the ptrace
sampler, in interleaved rounds. The cost is their summed throughput's
drop against the rounds without an agent (medians), beside the agent's own
CPU and, for the kernel sampler, its BPF program's, from its /metrics.

    python3 bench/agent_slowdown.py [--procs 16] [--rate 100] [--secs 10] [--rounds 3]
        [--samplers kernel,ptrace,kernel:cpu,kernel@/tmp/pyprof-before]

A sampler may name the build to run (SAMPLER[:MODE]@PATH), to set two
builds side by side in the same rounds.

Beside the throughput, each round adds up the spinners' own CPU time (from
/proc): on this machine, whose CPUs the spinners fill, what the agent takes
from them comes out of it, while the host's speed, which moves the
throughput by several percent within a minute, does not. The interrupts
and the BPF program run on the spinners' time (no IRQ time accounting
here), so `accounted` adds the program's measured time to the agent's:
(agent + BPF) / CPUs, the share of the machine they take, without the
interrupts' own entry and exit (bench/slowdown_pairs.py's floor).

The agent runs with --max-cpu 100%, so that its budget never lowers the
rate asked for: this measures the rate's cost, not the budget's.
"""

import argparse
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from children import die_with_parent

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYENV_ROOT = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))

# Spins from `start` (an absolute time.time()) for `secs`, then prints how
# many work units it did. Before `start` it sleeps: the agent attaches then.
SPINNER = r'''
import sys, time
start, secs = float(sys.argv[1]), float(sys.argv[2])
def leaf(x):
    return x * 3 + 1
def unit(i):
    s = 0
    for j in range(50):
        s += leaf(i + j)
    return s
time.sleep(max(0.0, start - time.time()))
end = time.monotonic() + secs
n = 0
while time.monotonic() < end:
    for _ in range(20):
        unit(n)
        n += 1
print(n, flush=True)
'''


def find_python(label):
    minor = label.split("3.")[-1]
    hits = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", "3.%s.*" % minor, "bin", "python3")))
    if not hits:
        sys.exit("agent_slowdown: no pyenv python 3.%s (scripts/setup-fixtures.sh installs it)" % minor)
    return hits[-1]


def metrics(url):
    rows = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            m = re.match(r'^([a-z_]+)(\{[^}]*\})? (\S+)$', line)
            if m:
                rows[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return rows


def cpu_secs(pid):
    return run_ns(pid) / 1e9


def run_ns(pid):
    """CPU time of every thread of `pid` so far, in ns (schedstat)."""
    total = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def one_round(args, python, script, sampler, tmp):
    """-> (summed work units per second, the spinners' CPU seconds per second, agent fields or None)."""
    start = time.time() + 2.0
    procs = [subprocess.Popen([python, script, "%.3f" % start, str(args.secs)], stdout=subprocess.PIPE,
                              preexec_fn=die_with_parent()) for _ in range(args.procs)]
    agent, url, agent_info = None, None, None
    if sampler:
        spec, _, build = sampler.partition("@")
        log = open(os.path.join(tmp, "agent-%s.log" % spec.replace(":", "-")), "wb")
        name, _, mode = spec.partition(":")
        argv = [build or args.pyprof, "agent", "--sampler", name, "-r", str(args.rate), "--max-cpu", "100%",
                "--listen", "127.0.0.1:0"] + (["--mode", mode] if mode else [])
        for p in procs:
            argv += ["--pid", str(p.pid)]
        agent = subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=die_with_parent())
        deadline = time.time() + 10
        while url is None and time.time() < deadline:
            time.sleep(0.05)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", open(log.name).read())
            url = m and m.group(1)
        if url is None:
            sys.exit("agent_slowdown: the agent printed no address: %s" % open(log.name).read())
    time.sleep(max(0.0, start - time.time()))
    before = (metrics(url), cpu_secs(agent.pid), time.monotonic()) if agent else None
    # The spinners' CPU over their spinning seconds: a second in, a second before the end.
    time.sleep(1.0)
    ns0, t0 = sum(run_ns(p.pid) for p in procs), time.monotonic()
    time.sleep(max(0.0, args.secs - 2.0))
    ns1, t1 = sum(run_ns(p.pid) for p in procs), time.monotonic()
    cpus = (ns1 - ns0) / 1e9 / (t1 - t0)
    counts = [int(p.communicate(timeout=args.secs + 60)[0].split()[-1]) for p in procs]
    if agent:
        after = (metrics(url), cpu_secs(agent.pid), time.monotonic())
        wall = after[2] - before[2]
        m0, m1 = before[0], after[0]
        d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
        agent_info = {
            "sampler": next((k.split('"')[1] for k in m1 if k.startswith("pyprof_agent_sampler_info")), "?"),
            "agent_cpu_pct": 100.0 * (after[1] - before[1]) / wall,
            "bpf_cpu_pct": 100.0 * d("pyprof_agent_bpf_program_seconds_total") / wall,
            "samples_per_s": d("pyprof_agent_samples_total") / wall,
            "rate_hz": m1.get("pyprof_agent_rate_hz"),
        }
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    return sum(counts) / args.secs, cpus, agent_info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pyprof", default=os.path.join(ROOT, "target", "release", "pyprof"))
    ap.add_argument("--python", default="pyenv-3.12", help="pyenv-3.N")
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--secs", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samplers", default="kernel,ptrace",
                    help="agents to compare: SAMPLER or SAMPLER:MODE (e.g. kernel:cpu), comma-separated")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    python = find_python(args.python)
    configs = [None] + args.samplers.split(",")
    tmp = tempfile.mkdtemp(prefix="pyprof_agent_slowdown_")
    script = os.path.join(tmp, "spinner.py")
    with open(script, "w") as f:
        f.write(SPINNER)
    runs = {str(c): [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for c in order:
            rate, cpus, info = one_round(args, python, script, c, tmp)
            runs[str(c)].append({"units_per_s": rate, "spinner_cpus": cpus, "agent": info})
            print("round %d %-7s %12.0f units/s %6.4f CPUs %s" % (r + 1, c or "none", rate, cpus, json.dumps(info) if info else ""), flush=True)
    base = statistics.median(x["units_per_s"] for x in runs["None"])
    base_cpus = statistics.median(x["spinner_cpus"] for x in runs["None"])
    ncpu = os.cpu_count()
    print("\n%d spinning %s processes, %d Hz, %g s a run, %d rounds (medians; CPU in %% of one CPU; shares in %% of the %d CPUs)"
          % (args.procs, args.python, args.rate, args.secs, args.rounds, ncpu))
    print("%-8s %9s %14s %11s %9s %11s %10s" % ("agent", "slowdown", "spinners' CPU", "agent CPU", "BPF CPU", "accounted", "samples/s"))
    summary = {}
    for c in configs[1:]:
        rs = runs[c]
        slow = 100.0 * (1.0 - statistics.median(x["units_per_s"] for x in rs) / base)
        cpu_loss = 100.0 * (1.0 - statistics.median(x["spinner_cpus"] for x in rs) / base_cpus)
        med = lambda k: statistics.median(x["agent"][k] for x in rs)
        accounted = statistics.median((x["agent"]["agent_cpu_pct"] + x["agent"]["bpf_cpu_pct"]) / ncpu for x in rs)
        summary[c] = {"slowdown_pct": slow, "spinner_cpu_loss_pct": cpu_loss, "agent_cpu_pct": med("agent_cpu_pct"),
                      "bpf_cpu_pct": med("bpf_cpu_pct"), "accounted_pct": accounted,
                      "samples_per_s": med("samples_per_s"), "ran": sorted({x["agent"]["sampler"] for x in rs})}
        s = summary[c]
        print("%-8s %8.2f%% %13.2f%% %10.2f%% %8.3f%% %10.2f%% %10.0f   (ran: %s)"
              % (c.split("@")[0] + ("@" + os.path.basename(c.split("@")[1]) if "@" in c else ""), slow, cpu_loss,
                 s["agent_cpu_pct"], s["bpf_cpu_pct"], accounted, s["samples_per_s"], ",".join(s["ran"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
