#!/usr/bin/env bash
# Fails (exit 1) when any C++/CUDA/proto source under the given roots is not
# formatted as .clang-format says, listing each file and a diff excerpt.
# Usage: check-format.sh [ROOT...]   (default: the repository's source folders)
# Environment: CLANG_FORMAT (default clang-format).
set -uo pipefail
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null; then
  echo "check-format: $cf not found (run deploy/install-deps.sh)" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -eq 0 ]; then
  set -- "$repo"/{common,kernels,engine,daemon,worker,cli,proto,bench,tests}
fi
bad=0
checked=0
while IFS= read -r -d '' f; do
  checked=$((checked + 1))
  if ! "$cf" --style=file:"$repo/.clang-format" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "misformatted: $f"
    diff <("$cf" --style=file:"$repo/.clang-format" "$f") "$f" | head -n 10
    bad=$((bad + 1))
  fi
done < <(find "$@" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.proto' \) -print0 2>/dev/null)
echo "check-format: $checked files checked, $bad misformatted"
if [ "$bad" -ne 0 ]; then
  echo "check-format: run 'make format' to fix" >&2
  exit 1
fi
