#!/usr/bin/env bash
# Fails (exit 1) when a function is longer than its folder allows, naming it
# (tests/format/function_length.py): the Jinja interpreter's code at most 100
# lines a function, every other source of the project's parts at most 130
# (long dispatch belongs in tables; see docs/ARCHITECTURE.md).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
count=$(python3 tests/format/function_length.py 0 engine/text/jinja/*.cc | wc -l)
[ "$count" -gt 0 ] || { echo "check-function-length: no function found in engine/text/jinja" >&2; exit 2; }
rc=0
python3 tests/format/function_length.py 100 engine/text/jinja/*.cc || rc=1
mapfile -t rest < <(find common kernels engine daemon worker cli proto \( -name '*.cc' -o -name '*.cu' \) \
  -not -path 'engine/text/jinja/*' | sort)
python3 tests/format/function_length.py 130 "${rest[@]}" || rc=1
[ $rc -eq 0 ] && echo "check-function-length: $count Jinja functions within 100 lines, ${#rest[@]} other files within 130"
exit $rc
