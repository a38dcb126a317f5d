#!/usr/bin/env bash
# Proves the format check can fail: a well-formatted file passes, a
# misformatted one makes check-format.sh exit 1 and name the file.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'int Add(int a, int b) { return a + b; }\n' > "$tmp/good.cc"
"$here/check-format.sh" "$tmp" > "$tmp/out" || { cat "$tmp/out"; echo "FAIL: formatted file rejected"; exit 1; }
printf 'int   Add( int a,int b ){\nreturn a+b;}\n' > "$tmp/bad.cc"
if "$here/check-format.sh" "$tmp" > "$tmp/out"; then
  cat "$tmp/out"; echo "FAIL: misformatted file accepted"; exit 1
fi
grep -q "misformatted: $tmp/bad.cc" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: file not named"; exit 1; }
echo "ok: misformatted file detected"
