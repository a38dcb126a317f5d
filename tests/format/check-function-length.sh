#!/usr/bin/env bash
# Fails (exit 1) when a function is longer than its folder allows, naming it
# (tests/format/function_length.py): every function of the project's parts,
# of tests/ and of bench/ at most 100 lines, the kernels' device code
# (unrolled tiles that read best whole) at most 130. Long dispatch belongs in
# tables; long procedures in named steps (docs/ARCHITECTURE.md).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
count=$(python3 tests/format/function_length.py 0 engine/text/jinja/*.cc | wc -l)
[ "$count" -gt 0 ] || { echo "check-function-length: no function found in engine/text/jinja" >&2; exit 2; }
rc=0
mapfile -t parts < <(find common engine daemon worker cli proto tests bench \( -name '*.cc' -o -name '*.cu' \) | sort)
python3 tests/format/function_length.py 100 "${parts[@]}" || rc=1
mapfile -t kernels < <(find kernels \( -name '*.cc' -o -name '*.cu' \) | sort)
python3 tests/format/function_length.py 130 "${kernels[@]}" || rc=1
[ $rc -eq 0 ] && echo "check-function-length: ${#parts[@]} files within 100 lines a function, ${#kernels[@]} kernel files within 130"
exit $rc
