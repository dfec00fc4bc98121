#!/usr/bin/env bash
# The GPU table's tiers on a lent device, in one call (issue 64, item 4): the figures, the bit-exact check and the
# four sanitizers, all into $OUT as JSON and logs, with the GPU's name.  Sized for ~8 minutes on an H100/H200.
#
#   Build here (nvcc, no GPU needed), carry the binaries, run there:
#     cmake -S . -B build/cuda -DHETERPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_TESTING=OFF
#     cmake --build build/cuda -j2 --target tier_bench table_bench
#     run(command="bash custom_ops/bench/tier_device_run.sh", carry=["build/cuda/bench"], timeout_s=590)
#   BENCH_DIR=dir (where tier_bench and table_bench are; default build/cuda/bench, built here if absent)
#   OUT=dir (default /tmp/tier-device-run)
#
# Steps, each under its own time limit so that one that hangs leaves the rest their time:
#   1. tier_bench: budgets 1, 0.5, 0.25, 0.1 and one step's distinct ids; Zipf 1.05 and 0.8; SGD and Adam;
#      the link's share each way (tier_bench.json)
#   2. tier_bench at Zipf 0.8, SGD, budgets 0.2, 0.15, 0.12: where the cliff was (tier_cliff.json)
#   3. gpu_check.sh: the bit-exact check against the CPU core through the tiers, plainly and under memcheck,
#      synccheck and initcheck (gpu_check.txt, logs/)
#   4. gpu_check.sh under racecheck alone (the slowest tool; racecheck.txt)
# then summary.json: the GPU, each step's exit status and seconds, the gpu_check summary lines, and the goals
# (0.25 at Zipf 1.05 within 3x of resident, one step's budget under 5.6x, Zipf 0.8 at 0.25 within 6x, each
# budget within 2x of the next larger one's) computed from tier_bench.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/tier-device-run}"
BENCH_DIR="${BENCH_DIR:-build/cuda/bench}"
mkdir -p "$OUT/logs"
t_start=$(date +%s)
steps=()

step() {  # $1 = name, $2 = seconds allowed, rest = command (stdout to $OUT/<name>.out, stderr to logs)
  local name="$1" limit="$2" t0 rc
  shift 2
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/logs/$name.err"
  rc=$?
  steps+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - t0))}")
  echo "== $name: rc $rc, $(($(date +%s) - t0)) s"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ ! -x "$BENCH_DIR/tier_bench" ] || [ ! -x "$BENCH_DIR/table_bench" ]; then
  echo "== building tier_bench and table_bench on the device"
  BENCH_DIR=/tmp/tier-device-build/bench
  step build 240 bash -c "cmake -S . -B /tmp/tier-device-build -DHETERPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DBUILD_TESTING=OFF && cmake --build /tmp/tier-device-build -j \$(nproc) --target tier_bench table_bench"
fi

step tier_bench 260 "$BENCH_DIR/tier_bench" --budgets 1,0.5,0.25,0.1 --one-step 1 --zipf 1.05,0.8 --optimizer sgd,adam
mv "$OUT/tier_bench.out" "$OUT/tier_bench.json"
step tier_cliff 80 "$BENCH_DIR/tier_bench" --budgets 1,0.2,0.15,0.12 --zipf 0.8 --optimizer sgd
mv "$OUT/tier_cliff.out" "$OUT/tier_cliff.json"
step gpu_check 120 env TABLE_BENCH="$BENCH_DIR/table_bench" REPS=2 JOBS=12 TOOLS="memcheck synccheck initcheck" \
  LOG_DIR="$OUT/logs/gpu_check" bash custom_ops/bench/gpu_check.sh
mv "$OUT/gpu_check.out" "$OUT/gpu_check.txt"
step racecheck 150 env TABLE_BENCH="$BENCH_DIR/table_bench" REPS=1 JOBS=4 TOOLS=racecheck PLAIN=0 \
  LOG_DIR="$OUT/logs/racecheck" bash custom_ops/bench/gpu_check.sh
mv "$OUT/racecheck.out" "$OUT/racecheck.txt"

python3 - "$OUT" "$(($(date +%s) - t_start))" "$(IFS=,; echo "${steps[*]}")" <<'EOF'
import json, sys
out, seconds, steps = sys.argv[1], int(sys.argv[2]), json.loads("[" + sys.argv[3] + "]")
def load(name):
    try:
        with open(f"{out}/{name}") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"unreadable": str(e)}
def lines(name):
    try:
        with open(f"{out}/{name}") as f:
            return [l.rstrip() for l in f if l.startswith(("plain", "memcheck", "racecheck", "synccheck", "initcheck"))]
    except OSError:
        return []
bench = load("tier_bench.json")
goals = {}
for opt in ("sgd", "adam"):
    for zipf in (1.05, 0.8):
        rows = sorted((c for c in bench.get("configs", []) if c["optimizer"] == opt and abs(c["zipf"] - zipf) < 1e-9),
                      key=lambda c: -c["budget"])
        by = {round(c["budget"], 3): c for c in rows if not c["one_step_budget"]}
        key = f"{opt}_zipf_{zipf}"
        if 0.25 in by:
            goals[key + "_0.25_slowdown"] = round(1 / by[0.25]["vs_resident"], 2) if by[0.25]["vs_resident"] else None
        step_rows = [c for c in rows if c["one_step_budget"]]
        if step_rows and step_rows[0]["vs_resident"]:
            goals[key + "_one_step_slowdown"] = round(1 / step_rows[0]["vs_resident"], 2)
        # each budget within 2x of the next larger one's (no cliff, no budget slower than a smaller one)
        chain = [c for c in rows if not c["one_step_budget"]]
        worst = max((b["median_step_ms"] / a["median_step_ms"] for a, b in zip(chain, chain[1:])), default=None)
        goals[key + "_worst_step_ratio_to_next_larger_budget"] = round(worst, 2) if worst else None
summary = {
    "gpu": open(f"{out}/gpu.txt").read().strip(),
    "seconds": seconds,
    "steps": steps,
    "gpu_check": lines("gpu_check.txt"),
    "racecheck": lines("racecheck.txt"),
    "goals": goals,
    "goal_targets": {"sgd_zipf_1.05_0.25_slowdown": 3.0, "sgd_zipf_1.05_one_step_slowdown": 5.6,
                     "sgd_zipf_0.8_0.25_slowdown": 6.0, "worst_step_ratio_to_next_larger_budget": 2.0},
}
with open(f"{out}/summary.json", "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps(summary, indent=1))
EOF
