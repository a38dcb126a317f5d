#!/usr/bin/env python3
"""Writes the DPO example's preference pairs from the chat-sft example's conversations
(examples/chat-sft/make_data.py): the same questions, the reply the SFT model learned as the
rejected response, and the reply in the style we prefer (the same reply, then an offer of more
help) as the chosen one, in TRL's conversational preference form that ftune's `data.format: preference` reads:

  {"prompt": [{"role": "user", ...}], "chosen": [{"role": "assistant", ...}],
   "rejected": [{"role": "assistant", ...}]}

  python3 make_pairs.py --chat runs/chat-sft/data.jsonl --out runs/dpo/pairs.jsonl

Deterministic: the same input gives the same file.
"""
import argparse
import json


OFFER = " Happy to help!"

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chat", required=True, help="chat-format conversations (one user and one assistant turn)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.chat, encoding="utf-8") as f, open(args.out, "w", encoding="utf-8") as out:
        for line in f:
            user, assistant = json.loads(line)["messages"]
            reply = assistant["content"]
            out.write(json.dumps({"prompt": [user],
                                  "chosen": [{"role": "assistant", "content": reply + OFFER}],
                                  "rejected": [{"role": "assistant", "content": reply}]}) + "\n")


if __name__ == "__main__":
    main()
