#!/usr/bin/env python3
"""Writes tokenizer.json and tokenizer_config.json of a small byte-level BPE
tokenizer in Hugging Face's format (the layout of GPT-2/Qwen2 tokenizers:
ByteLevel pre-tokenizer with the GPT-2 split regex, the 256 byte symbols,
merges learnt here from a few English and code lines, three added special
tokens, a ChatML chat template). The fuzz targets tokenizer_encode and
data_format use it. Deterministic: rerun it to regenerate the same files.
"""
import collections
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs.
def train(model, data): return model.fit(data, epochs=3)  # training the model
fine-tuning the model on the data: the loss goes down, then the accuracy goes up.
Hello world! Hello there, hello again. 12345 67890 3.14159 == true && false || none
"""


def bytes_to_unicode():
    """GPT-2's map from bytes to printable code points."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def learn_merges(words, count):
    vocab = collections.Counter(tuple(w) for w in words)
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, freq in vocab.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += freq
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for word, freq in vocab.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += freq
        vocab = merged
    return merges


def main():
    b2u = bytes_to_unicode()
    # Words as GPT-2 pre-tokenizes them, roughly: a leading space joins the word.
    words = []
    for line in CORPUS.splitlines():
        for i, w in enumerate(line.split(" ")):
            text = (" " if i else "") + w
            words.append("".join(b2u[b] for b in text.encode("utf-8")))
    merges = learn_merges(words, 120)
    vocab = {b2u[b]: i for i, b in enumerate(sorted(b2u))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(specials)]
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [a + " " + b for a, b in merges]},
    }
    chat_template = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
                     "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_bos_token": False, "chat_template": chat_template,
              "model_max_length": 2048, "tokenizer_class": "Qwen2Tokenizer"}
    with open(os.path.join(HERE, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(HERE, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
