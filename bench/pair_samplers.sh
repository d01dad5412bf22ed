#!/usr/bin/env bash
# Two pyprof samplers taking turns on one short_calls.py process: 2-s
# recordings at 1 kHz, N pairs, each recording's `loop` leaf share printed.
# Drift of the workload is common to a pair; a sampler whose recordings
# jump where the other's do not is the one that is off.
#   bench/pair_samplers.sh PYTHON [PAIRS] [SAMPLER_A] [SAMPLER_B]
set -euo pipefail
cd "$(dirname "$0")/.."
py=$1 pairs=${2:-8} a=${3:-kernel} b=${4:-ptrace}
out=$(mktemp -d)
nice -n -20 "$py" tests/scripts/short_calls.py >/dev/null &
target=$!
trap 'kill -9 $target 2>/dev/null; rm -rf "$out"' EXIT
sleep 1
for i in $(seq 1 "$pairs"); do
  for s in "$a" "$b"; do
    target/release/pyprof record --pid "$target" --sampler "$s" --mode cpu -r 1000 -d 2 -f json -o "$out/$s-$i.json" 2>/dev/null
  done
done
python3 - "$out" "$pairs" "$a" "$b" <<'PY'
import json, sys
out, pairs, samplers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for s in samplers:
    shares = []
    for i in range(1, pairs + 1):
        p = json.load(open(f"{out}/{s}-{i}.json"))
        counts, total = {}, 0
        for st in p["stacks"]:
            if st["frames"]:
                leaf = p["frames"][st["frames"][-1]]["function"]
                counts[leaf] = counts.get(leaf, 0) + st["count"]
                total += st["count"]
        shares.append(100 * counts.get("loop", 0) / total)
    print(f"{s:>8}: loop % " + " ".join(f"{x:.1f}" for x in shares))
PY
