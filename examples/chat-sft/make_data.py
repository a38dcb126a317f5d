#!/usr/bin/env python3
"""Writes the chat-sft example's training data: short conversations about
made-up countries (their capitals and languages), in the {"messages": [...]}
format ftune's `data.format: chat` reads. Facts no model has seen, so a reply
can only come from fine-tuning. Deterministic: the same arguments give the
same file.

  python3 make_data.py --out data.jsonl [--countries 12]
  python3 make_data.py --out eval.jsonl --countries 12 --eval

Each country gets four phrasings of "what is the capital" and two of "what
language"; --eval writes one held-out phrasing of each question instead.
"""
import argparse
import json
import random

SYLLABLES = ["zor", "va", "plim", "th", "ka", "lu", "ne", "dra", "qui", "ost", "mar", "bel", "tor", "ix",
             "sel", "ra", "un", "mo", "gri", "fa", "del", "po", "sk", "yr", "ven", "an", "lo", "tha"]
CAPITAL_QUESTIONS = ["What is the capital of {c}?", "Which city is the capital of {c}?",
                     "Tell me the capital of {c}.", "{c}'s capital is which city?"]
LANGUAGE_QUESTIONS = ["What language is spoken in {c}?", "Which language do people in {c} speak?"]
EVAL_QUESTIONS = ["Name the capital city of {c}.", "What do people speak in {c}?"]


def word(rng, parts):
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def countries(n, seed=7):
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        country, capital, language = word(rng, 3) + "ia", word(rng, 2), word(rng, 2) + "ish"
        if {country, capital, language} & seen:
            continue
        seen |= {country, capital, language}
        out.append((country, capital, language))
    return out


def chat(question, answer):
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--countries", type=int, default=12)
    ap.add_argument("--eval", action="store_true", help="the held-out phrasings instead")
    args = ap.parse_args()
    rows = []
    for country, capital, language in countries(args.countries):
        capital_answer = f"The capital of {country} is {capital}."
        language_answer = f"People in {country} speak {language}."
        if args.eval:
            rows += [chat(EVAL_QUESTIONS[0].format(c=country), capital_answer),
                     chat(EVAL_QUESTIONS[1].format(c=country), language_answer)]
            continue
        rows += [chat(q.format(c=country), capital_answer) for q in CAPITAL_QUESTIONS]
        rows += [chat(q.format(c=country), language_answer) for q in LANGUAGE_QUESTIONS]
    random.Random(11).shuffle(rows)
    with open(args.out, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
