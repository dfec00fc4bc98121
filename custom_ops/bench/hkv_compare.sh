#!/usr/bin/env bash
# Our CUDA table against HierarchicalKV on the same GPU, one run: builds HKV's benchmark routine (through
# custom_ops/bench/hkv_driver.cu, from a checkout of HKV's include/ and benchmark/: Apache-2.0, benchmark only,
# never part of this repository) and our table_bench, runs both for each dim, prints one table of ratios.
#
#   bash custom_ops/bench/hkv_compare.sh [--json] [BUILD_DIR]    (default BUILD_DIR: /tmp/heterps-hkv-compare)
#   HKV_DIR=path to a checkout of HierarchicalKV (https://github.com/NVIDIA-Merlin/HierarchicalKV; its include/
#   headers and benchmark/ are used), default .hkv in this checkout (ignored by git), e.g.
#   git clone https://github.com/NVIDIA-Merlin/HierarchicalKV .hkv     DIMS="8 32 64 128"   ZIPF=1.05
#   HKV_BENCH=path / TABLE_BENCH=path: binaries built elsewhere (nvcc for sm_90 builds them on any x86-64 host)
#
# Both sides, per dim: the same number of resident rows (HKV: capacity x load factor 0.5, as its benchmark
# measures; ours: that many rows), 1M (2^20) keys per call.  HKV's find looks up 60% present keys and its
# find_or_insert inserts the other 40%; our find is timed both with all keys present and with 60%, our pull
# and push with all present (a miss is served from the host tier, which HKV does not have), uniform ids and
# Zipf(ZIPF) ids.  Figures and commands: docs/sparse-table.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
json=()
if [ "${1:-}" = --json ]; then
  json=(--json)
  shift
fi
BUILD="${1:-/tmp/heterps-hkv-compare}"
LOG_DIR="${LOG_DIR:-$BUILD/logs}"
DIMS="${DIMS:-8 32 64 128}"
ZIPF="${ZIPF:-1.05}"
HKV_DIR="${HKV_DIR:-.hkv}"
if [ -z "${HKV_BENCH:-}" ] && [ ! -d "$HKV_DIR/include" ]; then
  echo "hkv_compare: no HierarchicalKV sources at '$HKV_DIR' (expected $HKV_DIR/include and $HKV_DIR/benchmark):" \
    "set HKV_DIR to a checkout of https://github.com/NVIDIA-Merlin/HierarchicalKV (or clone it to .hkv)," \
    "or HKV_BENCH to a built benchmark" >&2
  exit 2
fi
mkdir -p "$BUILD" "$LOG_DIR"

if [ -z "${TABLE_BENCH:-}" ]; then
  echo "== hkv_compare: building table_bench in $BUILD" >&2
  cmake -S . -B "$BUILD" -DHETERPS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$LOG_DIR/cmake.log" 2>&1
  cmake --build "$BUILD" -j "$(nproc)" --target table_bench >>"$LOG_DIR/cmake.log" 2>&1
  TABLE_BENCH="$BUILD/bench/table_bench"
fi
if [ -z "${HKV_BENCH:-}" ]; then
  echo "== hkv_compare: building HKV's benchmark from $HKV_DIR (about 2 minutes)" >&2
  nvcc -O3 -std=c++17 -arch="sm_${CUDA_ARCH:-90}" --expt-relaxed-constexpr -I "$HKV_DIR/include" \
    -I "$HKV_DIR/benchmark" custom_ops/bench/hkv_driver.cu -o "$BUILD/hkv_driver"
  HKV_BENCH="$BUILD/hkv_driver"
fi

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOG_DIR/gpu.txt" 2>/dev/null || true
nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' >>"$LOG_DIR/gpu.txt" || true
for dim in $DIMS; do
  case $dim in  # HKV's benchmark: capacity, GB of HBM for values
    8) cap=$((128 << 20)) hbm=4 ;;
    32) cap=$((128 << 20)) hbm=16 ;;
    64) cap=$((64 << 20)) hbm=16 ;;
    *) cap=$((32 << 20)) hbm=$(((32 << 20) * dim * 4 >> 30)) ;;
  esac
  echo "== dim $dim: HKV (capacity $cap, load factor 0.5)" >&2
  "$HKV_BENCH" "$dim" "$cap" "$hbm" >"$LOG_DIR/hkv-$dim.json"
  echo "== dim $dim: table_bench (rows $((cap / 2)))" >&2
  "$TABLE_BENCH" --check 0 --rows $((cap / 2)) --batch $((1 << 20)) --dim "$dim" --iters 20 --zipf "$ZIPF" \
    >"$LOG_DIR/ours-$dim.json"
done
python3 custom_ops/bench/hkv_compare.py "${json[@]}" "$LOG_DIR"
