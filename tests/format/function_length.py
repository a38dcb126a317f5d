#!/usr/bin/env python3
"""Lists the functions defined at namespace level in C++ files that are longer
than a limit, counted from the first line of the signature to the closing
brace. Comments, strings and character literals are skipped; braces of
namespaces do not count; class bodies and initializers are not functions.

Usage: function_length.py LIMIT FILE...   prints FILE:LINE: N lines (limit L):
SIGNATURE for each function over the limit and exits 1, or exits 0.
"""
import re
import sys

NOT_FUNCTION = re.compile(r"^\s*(template\s*<.*>\s*)?(class|struct|union|enum|namespace|extern)\b")


def strip(text):
    """`text` with comments, string and char literals and preprocessor lines
    blanked (newlines kept)."""
    text = re.sub(r"(?m)^[ \t]*#(?:.*\\\n)*.*$", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    text = re.sub(r"(?<=[0-9a-fA-F])'(?=[0-9a-fA-F])", "_", text)  # digit separators (100'000)
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(first line, length, signature) of each namespace-level function."""
    text = strip(open(path, encoding="utf-8").read())
    stack = []  # per open brace: "ns", "fn" or "other"
    head_start = 0  # where the current declaration's text began
    fn_start = None
    for i, c in enumerate(text):
        if c in ";}" and all(k == "ns" for k in stack):
            if c == "}" and stack:
                stack.pop()
            head_start = i + 1
            continue
        if c == "{":
            if all(k == "ns" for k in stack):
                head = text[head_start:i]
                if re.match(r"^\s*namespace\b", head) or re.match(r'^\s*extern\s+" *"', head):
                    stack.append("ns")
                    head_start = i + 1
                    continue
                is_fn = "(" in head and not NOT_FUNCTION.match(head) and "=" not in head.split("(")[0]
                stack.append("fn" if is_fn else "other")
                if is_fn:
                    first = head_start + len(head) - len(head.lstrip())
                    fn_start = (text.count("\n", 0, first) + 1, " ".join(head.split()))
            else:
                stack.append("inner")
        elif c == "}" and stack:
            kind = stack.pop()
            if kind == "fn" and fn_start:
                line, sig = fn_start
                yield line, text.count("\n", 0, i) + 1 - line + 1, sig
                fn_start = None
            if all(k == "ns" for k in stack):
                head_start = i + 1


def main():
    limit = int(sys.argv[1])
    bad = 0
    for path in sys.argv[2:]:
        for line, n, sig in functions(path):
            if n > limit:
                print(f"{path}:{line}: {n} lines (limit {limit}): {sig[:120]}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
