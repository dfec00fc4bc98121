#!/usr/bin/env bash
# The CUDA table's correctness on a GPU: build table_bench, run its check against the CPU core plainly and
# under compute-sanitizer's four tools, print one summary line per tool, exit non-zero on any failure.
#
#   bash custom_ops/bench/gpu_check.sh [BUILD_DIR]        (default: /tmp/heterps-gpu-check)
#   TABLE_BENCH=path/to/table_bench bash custom_ops/bench/gpu_check.sh   (use a binary built elsewhere)
#   REPS=3 (runs of each sanitized case; the failure issue 13 saw came in some runs and not others)
#   JOBS=8 (runs at a time: they share the GPU, and the sanitizers' overhead is mostly on the host)
#   LOG_DIR=dir (each run's output; default BUILD_DIR/gpu-check-logs)
#   TOOLS="memcheck synccheck initcheck" (the sanitizer tools to run; default all four: racecheck is by far the
#   slowest, so a device session with little time runs it in a call of its own), PLAIN=0 (skip the plain runs)
#
# The check (table_bench --check 1) pushes and pulls 60 batches with repeated ids through a device table
# whose budget holds a quarter of the ids, so rows travel device -> host tier -> device, for SGD, Adagrad
# and Adam (LRU) and Adagrad (LFU), and requires every row to equal the CPU core's bit for bit; each run
# also times a small table (--rows 65536 --batch 16384, one iteration) so that find, pull and push of
# resident rows run under the sanitizers too.  Plain runs cover dims 8 (16-byte units, 2 lanes per id),
# 12 (3 units, 4 lanes), 9 (scalar units) and 64 (16 lanes); sanitized runs dims 8 and 9.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-/tmp/heterps-gpu-check}"
REPS="${REPS:-3}"
LOG_DIR="${LOG_DIR:-$BUILD/gpu-check-logs}"
mkdir -p "$LOG_DIR"

if [ -z "${TABLE_BENCH:-}" ]; then
  echo "== gpu_check: building table_bench in $BUILD"
  cmake -S . -B "$BUILD" -DHETERPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$LOG_DIR/cmake.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" --target table_bench >>"$LOG_DIR/cmake.log" 2>&1 || {
    tail -30 "$LOG_DIR/cmake.log"
    echo "gpu_check: build FAILED"
    exit 2
  }
  TABLE_BENCH="$BUILD/bench/table_bench"
fi
SAN="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/== gpu: /'

small=(--rows 65536 --batch 16384 --iters 1)
JOBS="${JOBS:-$(($(nproc) > 8 ? 8 : $(nproc)))}"  # runs at a time (the sanitizers' cost is mostly host-side)
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.rc
run() {  # $1 = tool (plain or a sanitizer tool), $2 = log name, rest = table_bench arguments
  local tool="$1" name="$2"
  shift 2
  local log="$LOG_DIR/$tool-$name.log" rc
  if [ "$tool" = plain ]; then
    "$TABLE_BENCH" "$@" >"$log" 2>&1
    rc=$?
  else
    "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 20 "$TABLE_BENCH" "$@" >"$log" 2>&1
    rc=$?
  fi
  if [ $rc -eq 0 ] && ! grep -q '"correctness": {"ok": true' "$log"; then rc=98; fi
  echo "$rc $*" >"${log%.log}.rc"
}
spawn() {
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run "$@" &
}

TOOLS="${TOOLS:-memcheck racecheck synccheck initcheck}"
PLAIN="${PLAIN:-1}"
start=$(date +%s)
if [ "$PLAIN" = 1 ]; then
  for r in $(seq 1 "$REPS"); do spawn plain "dim8-$r" --check-dim 8 --dim 8 "${small[@]}"; done
  spawn plain dim12 --check-dim 12 --dim 12 "${small[@]}"
  spawn plain dim9 --check-dim 9 --dim 9 "${small[@]}"
  spawn plain dim64 --check-dim 64 --dim 64 "${small[@]}"
fi
for tool in $TOOLS; do
  for r in $(seq 1 "$REPS"); do spawn "$tool" "dim8-$r" --check-dim 8 --dim 8 "${small[@]}"; done
  spawn "$tool" dim9 --check-dim 9 --dim 9 "${small[@]}"
done
wait

status=0
echo "== gpu_check summary ($JOBS runs at a time, $(($(date +%s) - start)) s; logs in $LOG_DIR)"
summarised="$TOOLS"
[ "$PLAIN" = 1 ] && summarised="plain $TOOLS"
for tool in $summarised; do
  n=0 f=0
  for rcf in "$LOG_DIR/$tool"-*.rc; do
    [ -e "$rcf" ] || continue
    n=$((n + 1))
    read -r rc args <"$rcf"
    if [ "$rc" -ne 0 ]; then
      f=$((f + 1))
      echo "   FAILED: $tool $args (rc $rc, log ${rcf%.rc}.log):"
      grep -E '"failure"|ERROR SUMMARY|RACECHECK SUMMARY|rror' "${rcf%.rc}.log" | head -5 | sed 's/^/     /'
    fi
  done
  # racecheck ends with "RACECHECK SUMMARY: N hazards displayed (...)", the other tools with "ERROR SUMMARY: N errors"
  errs=$(cat "$LOG_DIR/$tool"-*.log 2>/dev/null | grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' |
    awk '{s += $4} END {print s + 0}')
  if [ "$f" -eq 0 ] && [ "$n" -gt 0 ]; then
    verdict=PASS
  else
    verdict=FAIL
    status=1
  fi
  if [ "$tool" = plain ]; then
    printf '%-10s %s: %d of %d runs passed the bit-exact check against the CPU core\n' "$tool" "$verdict" $((n - f)) "$n"
  else
    printf '%-10s %s: %d of %d runs passed, %s sanitizer errors\n' "$tool" "$verdict" $((n - f)) "$n" "$errs"
  fi
done
exit $status
