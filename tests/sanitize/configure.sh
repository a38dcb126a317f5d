#!/usr/bin/env bash
# Configures a clang build tree for the sanitizer runs (no CUDA):
#   asan: ASan + UBSan, with libFuzzer coverage (FT_FUZZ=ON), so one tree
#         serves the ASan suite (tests/sanitize/run.sh) and the fuzzers
#         (tests/fuzz/run.sh);
#   tsan: ThreadSanitizer.
# Usage: configure.sh asan|tsan BUILD_DIR. Prints the tail of CMake's log and
# exits 1 when configuring fails; reconfiguring an existing tree is a no-op.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
kind=${1:?usage: configure.sh asan|tsan BUILD_DIR}
build=${2:?usage: configure.sh asan|tsan BUILD_DIR}
case "$kind" in
  asan) flags=(-DFT_SANITIZE=address -DFT_FUZZ=ON) ;;
  tsan) flags=(-DFT_SANITIZE=thread -DFT_FUZZ=OFF) ;;
  *) echo "configure.sh: the kind is 'asan' or 'tsan', not '$kind'" >&2; exit 2 ;;
esac
mkdir -p "$build"
if ! cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DFT_CUDA=OFF -DFT_WERROR=OFF "${flags[@]}" > "$build/configure.log" 2>&1; then
  tail -30 "$build/configure.log"
  exit 1
fi
