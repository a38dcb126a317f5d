#!/usr/bin/env python3
"""Optional cross-check: re-renders every case of expected_chat.json with
Python's jinja2 set up as transformers sets it up for apply_chat_template
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
tojson = json.dumps(ensure_ascii=False), raise_exception) and reports any case
where @huggingface/jinja's rendering differs. ftune follows Python's
semantics, so a case listed here must be dropped or changed before it is
committed. Needs `pip install jinja2` and node_modules (npm ci) beside it.

Usage: python3 cross_check_python.py
"""
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.environ.get("FT_CHAT_NODE_MODULES", os.path.join(HERE, "node_modules"))


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def make_environment():
    """jinja2 as transformers' apply_chat_template sets it up."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main():
    env = make_environment()
    with open(os.path.join(HERE, "expected_chat.json"), encoding="utf-8") as f:
        doc = json.load(f)
    templates = {}
    for name, fam in doc["families"].items():
        if fam["template_file"]:
            with open(os.path.join(HERE, fam["template_file"]), encoding="utf-8") as f:
                source = f.read()
        else:
            path = os.path.join(NODE_MODULES, fam["package"], "models", "tokenizer_config.json")
            with open(path, encoding="utf-8") as f:
                source = json.load(f)["chat_template"]
        templates[name] = env.from_string(source)
    differ = 0
    for case in doc["cases"]:
        fam = doc["families"][case["family"]]
        try:
            out, err = templates[case["family"]].render(
                messages=case["messages"],
                add_generation_prompt=case["add_generation_prompt"],
                bos_token=fam["bos_token"],
                eos_token=fam["eos_token"],
                tools=case["tools"],
                **case["extra"],
            ), None
        except jinja2.exceptions.TemplateError as e:
            out, err = None, str(e)
        same = (err is None) == ("error" not in case) and (err is not None or out == case["rendered"])
        if not same:
            differ += 1
            print(f"DIFFERS: {case['family']}/{case['conversation']} add_generation_prompt={case['add_generation_prompt']}")
            print(f"  @huggingface/jinja: {case.get('rendered', case.get('error'))!r}")
            print(f"  python jinja2:      {out if err is None else err!r}")
    print(f"{len(doc['cases'])} cases, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
