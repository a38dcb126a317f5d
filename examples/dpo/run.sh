#!/usr/bin/env bash
# The preference-tuning example, end to end (examples/dpo/README.md):
#   1. the chat-sft example's merged model (its SFT adapter folded in; run.sh runs that example
#      first when its output is missing);
#   2. preference pairs made from its conversations: make_pairs.py (chosen = the trained reply
#      followed by an offer of help, rejected = the trained reply alone), in TRL's
#      conversational form;
#   3. `ftctl up` and `ftctl submit job.yaml --follow`: DPO with a LoRA adapter;
#   4. the reward margin at the first and the last step (metrics.jsonl), and `ft-train generate
#      --chat` on questions of the training set and of the held-out set, with the DPO adapter and
#      without it,
# and checks that the margin rose and that the adapter answers in the chosen style (the same fact,
# then the offer) where the SFT model does not: exit 0 then, 1 otherwise (answers printed).
#
# Usage, from the repository root after `make build`:
#   bash examples/dpo/run.sh [BUILD_DIR]
# Environment (the test sets them for a shortened run):
#   DPO_RUN        where the DPO run goes (default runs/dpo)
#   CHAT_SFT_RUN   the chat-sft example's run (default runs/chat-sft)
#   DPO_STEPS      optimizer steps (default: job.yaml's train.max_steps)
#   DPO_CHECK      questions checked from each set (default 4)
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/examples/dpo"
source "$ROOT/examples/lib.sh"  # BIN, TRAIN, CTL; start_ftune, ask
RUN=$(mkdir -p "${DPO_RUN:-$ROOT/runs/dpo}" && cd "${DPO_RUN:-$ROOT/runs/dpo}" && pwd)
SFT="${CHAT_SFT_RUN:-$ROOT/runs/chat-sft}"
CHECK=${DPO_CHECK:-4}

# 1. The SFT model.
if [ ! -f "$SFT/out/merged/model.safetensors" ]; then
  echo "no chat-sft output in $SFT: running examples/chat-sft/run.sh first"
  CHAT_SFT_RUN="$SFT" bash "$ROOT/examples/chat-sft/run.sh" "$BUILD"
fi
SFT=$(cd "$SFT" && pwd)

# 2. The pairs.
rm -rf "$RUN/out" "$RUN/ftune"
python3 "$HERE/make_pairs.py" --chat "$SFT/data.jsonl" --out "$RUN/pairs.jsonl"
python3 "$HERE/make_pairs.py" --chat "$SFT/eval.jsonl" --out "$RUN/eval.jsonl"
echo "pairs: $(wc -l < "$RUN/pairs.jsonl") in $RUN/pairs.jsonl, $(wc -l < "$RUN/eval.jsonl") held out"

# 3. ftd and a local worker; the job.
start_ftune "$RUN"
submit_job "$HERE/job.yaml" "$SFT/out/merged" "$RUN/pairs.jsonl" "$RUN/eval.jsonl" "$RUN/out" "${DPO_STEPS:-}"
echo "adapter in $RUN/out/adapter"

# 4. The margin, then questions: with the DPO adapter and without it (the SFT model).
read -r first last accuracy < <(python3 - "$RUN/out/metrics.jsonl" <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if "rewards/margins" in j and "event" not in j]
print(steps[0]["rewards/margins"], steps[-1]["rewards/margins"], steps[-1]["rewards/accuracies"])
PY
)
echo "rewards/margins: $first at step 1, $last at the last step (accuracy $accuracy)"
styled=0 plain=0 checked=0
while IFS=$'\t' read -r question reply; do
  tuned=$(ask "$SFT/out/merged" "$RUN/out/adapter" <<< "$question")
  base=$(ask "$SFT/out/merged" <<< "$question")
  printf '\nQ: %s\n   with the DPO adapter: %s\n   SFT model:            %s\n' "$question" "$tuned" "$base"
  checked=$((checked + 1))
  [ "$tuned" = "$reply Happy to help!" ] && styled=$((styled + 1))
  [ "$base" = "$reply" ] && plain=$((plain + 1))
done < <(for f in "$SFT/data.jsonl" "$SFT/eval.jsonl"; do head -n "$CHECK" "$f"; done |
  python3 -c 'import json,sys; [print(m[0]["content"] + "\t" + m[1]["content"]) for m in (json.loads(l)["messages"] for l in sys.stdin)]')
echo
echo "the chosen style with the DPO adapter: $styled/$checked; the SFT model's plain reply: $plain/$checked"
python3 -c "import sys; sys.exit(0 if $last > $first + 1 else 1)" || { echo "the margin did not rise"; exit 1; }
[ "$styled" -eq "$checked" ] && [ "$plain" -eq "$checked" ]
