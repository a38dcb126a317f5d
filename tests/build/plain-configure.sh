#!/usr/bin/env bash
# A plain configure (FT_WERROR not given, as a user or packager runs cmake)
# compiles our code with warnings on and without -Werror, for C++ and CUDA
# alike: a compiler newer than ours prints its new warnings instead of failing
# the build. The trees we build ourselves pass -DFT_WERROR=ON (Makefile,
# tests/build/engine-only.sh). Configures only: seconds, no compile.
# Usage: plain-configure.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
rm -rf "$build"
cmake -S "$src" -B "$build" -G Ninja > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
commands="$build/compile_commands.json"
fail() { echo "plain-configure: $*" >&2; exit 1; }
grep -qx 'FT_WERROR:BOOL=OFF' "$build/CMakeCache.txt" || fail "FT_WERROR is not OFF by default"
grep -q -- '-Wall' "$commands" || fail "no -Wall in $commands: warnings would not be printed"
if grep -n -- '-Werror' "$commands" | head -3; then fail "-Werror in a plain configure's compile commands (above)"; fi
echo "plain-configure: warnings on, none an error ($(grep -c '"file"' "$commands") compile commands)"
