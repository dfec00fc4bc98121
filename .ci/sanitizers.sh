#!/usr/bin/env bash
# Sanitizer runs of the sparse-table core (called by .ci/run):
#   1. ASan + UBSan build, all core tests (CTest), the CUDA table's host model included;
#   2. TSan build, the concurrency test.
# Each part is skipped, with a message, when the compiler cannot link that sanitizer's runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${HETERPS_JOBS:-2}"
CXX="${CXX:-c++}"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

have_runtime() {  # $1 = -fsanitize value
  local probe
  probe="$(mktemp -d)"
  echo 'int main(){return 0;}' > "$probe/p.cc"
  if "$CXX" -fsanitize="$1" "$probe/p.cc" -o "$probe/p" >/dev/null 2>&1 && "$probe/p" >/dev/null 2>&1; then
    rm -rf "$probe"; return 0
  fi
  rm -rf "$probe"; return 1
}

build() {  # $1 = build dir, $2 = sanitizer list, rest = targets
  local dir="$1" san="$2"; shift 2
  cmake -S . -B "$dir" "${GEN[@]}" -DHETERPS_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DHETERPS_SANITIZE="$san" >/dev/null
  cmake --build "$dir" -j "$JOBS" --target "$@"
}

status=0
if have_runtime address,undefined; then
  echo "== sanitizers: ASan+UBSan core tests"
  build build/asan address,undefined test_table test_concurrency test_table_model
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure || status=1
else
  echo "== sanitizers: SKIP ASan+UBSan (runtime not available to $CXX)"
fi

if have_runtime thread; then
  echo "== sanitizers: TSan concurrency test"
  build build/tsan thread test_concurrency
  # setarch -R: TSan of gcc 12 fails on kernels with high mmap ASLR entropy ("unexpected memory mapping").
  runner=()
  if command -v setarch >/dev/null && setarch "$(uname -m)" -R true 2>/dev/null; then runner=(setarch "$(uname -m)" -R); fi
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "${runner[@]}" build/tsan/test_concurrency build/tsan/test-tmp \
    || status=1
else
  echo "== sanitizers: SKIP TSan (runtime not available to $CXX)"
fi
exit $status
