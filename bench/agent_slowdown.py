#!/usr/bin/env python3
"""What `pyprof agent` costs the processes it samples: N spinning Python
processes (16 by default) count their own work over the same seconds, with
no agent, with the agent on the kernel sampler and with it on the ptrace
sampler, in interleaved rounds. The cost is their summed throughput's
drop against the rounds without an agent (medians), beside the agent's own
CPU and, for the kernel sampler, its BPF program's, from its /metrics.

    python3 bench/agent_slowdown.py [--procs 16] [--rate 100] [--secs 10] [--rounds 3]
        [--samplers kernel,ptrace,kernel:cpu]

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
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(args, python, script, sampler, tmp):
    """-> (summed work units per second, agent fields or None)."""
    start = time.time() + 2.0
    procs = [subprocess.Popen([python, script, "%.3f" % start, str(args.secs)], stdout=subprocess.PIPE,
                              preexec_fn=die_with_parent()) for _ in range(args.procs)]
    agent, url, agent_info = None, None, None
    if sampler:
        log = open(os.path.join(tmp, "agent-%s.log" % sampler.replace(":", "-")), "wb")
        name, _, mode = sampler.partition(":")
        argv = [args.pyprof, "agent", "--sampler", name, "-r", str(args.rate), "--max-cpu", "100%",
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
    return sum(counts) / args.secs, agent_info


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
            rate, info = one_round(args, python, script, c, tmp)
            runs[str(c)].append({"units_per_s": rate, "agent": info})
            print("round %d %-7s %12.0f units/s %s" % (r + 1, c or "none", rate, json.dumps(info) if info else ""), flush=True)
    base = statistics.median(x["units_per_s"] for x in runs["None"])
    print("\n%d spinning %s processes, %d Hz, %g s a run, %d rounds (medians)" % (args.procs, args.python, args.rate, args.secs, args.rounds))
    print("%-8s %9s %11s %9s %10s" % ("agent", "slowdown", "agent CPU", "BPF CPU", "samples/s"))
    summary = {}
    for c in configs[1:]:
        rs = runs[c]
        slow = 100.0 * (1.0 - statistics.median(x["units_per_s"] for x in rs) / base)
        med = lambda k: statistics.median(x["agent"][k] for x in rs)
        summary[c] = {"slowdown_pct": slow, "agent_cpu_pct": med("agent_cpu_pct"), "bpf_cpu_pct": med("bpf_cpu_pct"),
                      "samples_per_s": med("samples_per_s"), "ran": sorted({x["agent"]["sampler"] for x in rs})}
        s = summary[c]
        print("%-8s %8.2f%% %10.2f%% %8.3f%% %10.0f   (ran: %s)" % (c, slow, s["agent_cpu_pct"], s["bpf_cpu_pct"], s["samples_per_s"], ",".join(s["ran"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
