#!/usr/bin/env bash
# Configures, builds and tests an engine-only, CPU-only tree (-DFT_ENGINE_ONLY=ON
# -DFT_CUDA=OFF) with every package outside the engine's needs hidden from
# CMake: no gRPC, protobuf, SQLite, Boost, CLI11, spdlog, yaml-cpp, nlohmann-json,
# OpenBLAS, OpenSSL, and GoogleTest only from its source tree. This is what a GPU
# machine without our Debian libraries does (docs/BUILDING.md). It is also CI's
# Release build: -O3 with warnings as errors (GCC 12 warns at -O3 where -O2 does
# not, and a packager's `cmake -DCMAKE_BUILD_TYPE=Release` must build).
# Usage: engine-only.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
hide=()
for pkg in gRPC Protobuf SQLite3 Boost CLI11 spdlog yaml-cpp nlohmann_json BLAS OpenSSL GTest; do
  hide+=("-DCMAKE_DISABLE_FIND_PACKAGE_${pkg}=ON")
done
cmake -S "$src" -B "$build" -G Ninja -DFT_ENGINE_ONLY=ON -DFT_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DFT_WERROR=ON \
  -DFT_GTEST_SOURCE_DIR=/usr/src/googletest "${hide[@]}" > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
grep -q "engine-only ON" "$build.configure.log"
cmake --build "$build" -j "$(nproc)" > "$build.build.log" 2>&1 || { tail -50 "$build.build.log"; exit 1; }
# Its tests: what -O3 could change (numerics against the goldens, kernels, the trainer's exact
# sums), not again the normal tree's longest process-level cases (offload, checkpoint kill -9 and
# resume, DDP/FSDP ranks, and the guarded-backend twins: by tests/engine/CMakeLists.txt's COST, 165 +
# 100 + 80 s for the first three and 135 s for one twin, on 2 cores), whose resume and offload
# plumbing the optimiser level does not change; every file they compile is still built here.
cd "$build" && ctest --output-on-failure -LE 'format|build' -E '_guarded_test$|^engine_(offload|checkpoint|ddp)_test$' \
  -j "$(nproc)"
