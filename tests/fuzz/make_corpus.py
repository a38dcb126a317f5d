#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/
(small valid and near-valid inputs; libFuzzer mutates from them, and every
build replays them). Deterministic; inputs that fuzzing found are added to
the same folders by hand, named finding-*, and kept. Run from anywhere.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- protobuf wire format (enough for the session messages) ----
def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, value):
    if isinstance(value, bool) or isinstance(value, int):
        return varint(num << 3) + varint(int(value))
    if isinstance(value, float):
        return varint((num << 3) | 1) + struct.pack("<d", value)
    if isinstance(value, str):
        value = value.encode()
    return varint((num << 3) | 2) + varint(len(value)) + value


def msg(*fields):
    return b"".join(field(n, v) for n, v in fields)


def record(data):
    return struct.pack("<H", len(data)) + data


def session():
    # "J": the job's id, "C": the attempt credential ftd handed out, "O/...": a path in output.dir
    # (tests/fuzz/daemon_session_fuzz.cc).
    device = msg((1, 0), (2, "cpu"), (3, "cpu0"), (4, 8 << 30), (5, 8 << 30))
    register = msg((1, "w1"), (2, "host"), (3, "0.1"), (4, device), (14, "instance-1"))
    progress = lambda step: msg((1, "J"), (2, 1), (3, step), (4, 10), (5, 2.5), (6, 100.0), (7, "C"))
    heartbeat = lambda step: msg((2, msg((1, device), (2, progress(step)))))
    ckpt = lambda d, cred="C": msg((3, msg((1, "J"), (2, 1), (3, 2), (4, d), (5, "ab" * 32), (6, 0.5), (7, cred))))
    checkpoint = ckpt("O/checkpoints/step-00000002")
    metrics = msg((5, msg((1, "J"), (2, 1), (3, msg((1, 1), (2, 2.5), (3, 1e-4), (4, 1.0), (8, 1))), (4, "C"))))
    log = msg((6, msg((1, "J"), (2, 1), (3, "step 1 loss 2.5\n"), (4, "C"))))
    note = msg((7, msg((1, "J"), (2, 1), (3, "resume"), (4, "resumed"), (5, 2), (6, "/tmp/ck"), (7, "C"))))
    exited = lambda outcome, code, cred="C": msg(
        (4, msg((1, "J"), (2, 1), (3, outcome), (4, code), (5, "done"), (6, 10), (9, cred))))
    base = record(register) + record(heartbeat(1)) + record(metrics) + record(log)
    write("daemon_session", "run-to-end", base + record(checkpoint) + record(heartbeat(10)) + record(exited(1, 0)))
    write("daemon_session", "preempted", base + record(checkpoint) + record(exited(2, 3)))
    write("daemon_session", "superseded", base + record(exited(6, 4)))
    write("daemon_session", "note-and-failure", base + record(note) + record(exited(3, 1)))
    write("daemon_session", "wrong-epoch", record(register) + record(heartbeat(1).replace(b"\x10\x01", b"\x10\x07")))
    write("daemon_session", "register-only", record(register))
    running = msg((1, "J"), (2, 1), (5, "C"))
    write("daemon_session", "reattach", record(msg((1, "w2"), (4, device), (6, running))))
    # Forged: another registered worker reports on w1's attempt (with the right credential too).
    other = msg((1, msg((1, "w2"), (2, "host2"), (4, device), (14, "instance-2"))))
    write("daemon_session", "forged-from-other-worker",
          base + record(other) + record(exited(1, 0)) + record(metrics) + record(log) + record(heartbeat(99))
          + record(checkpoint) + record(note) + record(exited(2, 3, "")))
    # The right worker with a wrong or no credential.
    write("daemon_session", "wrong-credential",
          record(register) + record(exited(1, 0, "C" * 64)) + record(exited(2, 3, "")) + record(ckpt("O/c/s", "x")))
    # Checkpoints outside output.dir: elsewhere, "..", a relative path.
    write("daemon_session", "checkpoint-outside-output",
          base + record(ckpt("/tmp/elsewhere/step-2")) + record(ckpt("O/../../etc")) + record(ckpt("rel/step-2"))
          + record(ckpt("O/checkpoints/../step-2")))
    # The same id again: another instance (refused while w1 lives), then w1's own instance.
    again = lambda instance: msg((1, msg((1, "w1"), (2, "host2"), (4, device), (14, instance))))
    write("daemon_session", "duplicate-id", base + record(again("instance-2")) + record(again("instance-1"))
          + record(exited(1, 0)))
    write("daemon_session", "too-many-devices", record(msg((1, "w1"), (2, "host"), *[(4, device)] * 65)))


def safetensors(header, data=b""):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def raw_safetensors(header_text, data=b""):
    """A header given as text: what json.dumps cannot write (a name repeated)."""
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def main():
    # job.yaml
    write("job_spec", "tiny-lora.yaml", open(os.path.join(ROOT, "examples/tiny-lora/job.yaml")).read())
    write("job_spec", "qlora.yaml", """name: q
model: {path: model, dtype: bf16, quantization: {type: nf4, double_quant: true, block_size: 64}}
adapter: {type: lora, r: 16, alpha: 32, dropout: 0.05, target_modules: [q_proj, v_proj]}
data: {train: data.jsonl, eval: eval.jsonl, format: chat, seq_len: 512, packing: true, shuffle: true}
train: {max_steps: 100, global_batch_size: 16, micro_batch_size: 2, lr: 2.0e-4, warmup_steps: 10,
        lr_schedule: cosine, weight_decay: 0.01, max_grad_norm: 1.0, seed: 7}
checkpoint: {every_steps: 10, every_minutes: 5, keep: 2}
resources: {device: auto, gpus: 1, priority: 3}
output: {dir: out}
""")
    write("job_spec", "bad-key.yaml", "model: {path: m}\ntrian: {lr: 1}\n")
    write("job_spec", "anchors.yaml", "a: &x {path: m}\nmodel: *x\nadapter: {type: lora, r: 99999999999999999999}\n")
    # Numbers that would corrupt a run silently (each refused), and repeated keys (refused, naming both lines).
    base = "model: {path: m}\ndata: {train: d.jsonl}\noutput: {dir: o}\n"
    write("job_spec", "nonfinite-lr.yaml", base + "train: {max_steps: 4, lr: .inf}\n")
    write("job_spec", "nonfinite-nan.yaml", base + "adapter: {alpha: .nan}\ntrain: {max_steps: 4, adam_eps: .NaN, "
          "weight_decay: -.Inf}\ncheckpoint: {every_minutes: .nan}\n")
    write("job_spec", "out-of-range.yaml", base + "train: {max_steps: 4, lr: 1e308, warmup_steps: 9223372036854775807}"
          "\ncheckpoint: {every_steps: -5}\nresources: {max_failures: -1}\n")
    write("job_spec", "overflow.yaml", base + "train: {max_steps: 4, lr: 1e999}\n")
    write("job_spec", "duplicate-key.yaml", base + "train:\n  max_steps: 4\n  lr: 1.0e-4\n  lr: 1.0\n")
    write("job_spec", "duplicate-section.yaml", base + "train: {max_steps: 4}\noutput: {dir: elsewhere}\n")
    # Memory bombs (issue #41), each refused before a tree is built: over the size limit, past the
    # node limit within it, nested past the depth limit in flow and in block style.
    job = base + "train: {max_steps: 4}\n"
    write("job_spec", "huge.yaml", job + "# " + "x" * (260 << 10) + "\n")
    write("job_spec", "many-nodes.yaml", job.replace("d.jsonl}", "d.jsonl, chat_template_vars: {x: [" +
                                                     ",".join(["a"] * 12000) + "]}}"))
    write("job_spec", "deep-flow.yaml", job + "name: " + "[" * 5000 + "]" * 5000 + "\n")
    write("job_spec", "deep-block.yaml", job + "name:\n" + "".join(" " * (2 * i + 2) + "-\n" for i in range(40)))
    # safetensors
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    write("safetensors", "f32", safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                             "__metadata__": {"format": "pt"}}, f32))
    write("safetensors", "mixed", safetensors({
        "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
        "b": {"dtype": "F16", "shape": [1, 2], "data_offsets": [4, 8]},
        "c": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]},
        "d": {"dtype": "F64", "shape": [1], "data_offsets": [12, 20]}}, b"\x80\x3f\x00\x40\x00\x3c\x00\x40abcd" +
        struct.pack("<d", 0.5)))
    write("safetensors", "overlap", safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                                 "v": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, f32))
    write("safetensors", "empty-shape", safetensors({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                                                     "z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]}},
                                                    f32[:4]))
    # Hostile shapes, each refused by name (engine/io/safetensors.h): a name twice (JSON keeps the last),
    # a range inside another, offsets past the end or backwards, byte counts that overflow 64 bits.
    entry = lambda name, shape, begin, end, dtype="F32": (
        f'"{name}":{{"dtype":"{dtype}","shape":{json.dumps(shape)},"data_offsets":[{begin},{end}]}}')
    write("safetensors", "duplicate-name", raw_safetensors(
        "{" + entry("w", [2], 0, 8) + "," + entry("w", [2], 8, 16) + "}", f32))
    write("safetensors", "overlap-inside", safetensors({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, f32))
    write("safetensors", "offsets-past-end", safetensors({"w": {"dtype": "F32", "shape": [4],
                                                                "data_offsets": [16, 32]}}, f32))
    write("safetensors", "offsets-backwards", safetensors({"w": {"dtype": "F32", "shape": [0],
                                                                 "data_offsets": [2 ** 64 - 1, 0]}}, f32))
    write("safetensors", "huge-shape", raw_safetensors("{" + entry("h", [2 ** 62, 8], 0, 0) + "}"))
    write("safetensors", "huge-shape-i8", raw_safetensors("{" + entry("h", [2 ** 63 - 1, 2], 0, 0, "I8") + "}"))
    write("safetensors", "huge-rank", raw_safetensors("{" + entry("h", [65536] * 8, 0, 16) + "}", f32))
    # model.safetensors.index.json of the tiny-llama directory the safetensors target makes
    tiny = ["lm_head", "model.embed_tokens", "model.norm"] + [
        f"model.layers.{i}.{m}" for i in range(2) for m in (
            "input_layernorm", "post_attention_layernorm", "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
            "self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj")]
    index = lambda shard: json.dumps({"weight_map": {f"{t}.weight": shard for t in tiny}})
    write("safetensors", "index-valid.json", index("model.safetensors"))
    write("safetensors", "index-dotdot.json", index("../index-model/model.safetensors"))
    write("safetensors", "index-absolute.json", index("/etc/passwd"))
    write("safetensors", "index-dot-subdir.json", index("./sub/../model.safetensors"))
    write("safetensors", "index-not-a-string.json", json.dumps({"weight_map": {"lm_head.weight": 7}}))
    # A tensor named twice in weight_map (JSON keeps the last): refused, naming both shards.
    write("safetensors", "index-duplicate-tensor.json",
          index("model.safetensors")[:-2] + ', "lm_head.weight": "other.safetensors"}}')
    # config.json
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16"}
    write("hf_config", "llama.json", json.dumps(llama, indent=1))
    qwen = dict(llama, model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_scaling=None,
                tie_word_embeddings=True, attention_bias=True)
    write("hf_config", "qwen2.json", json.dumps(qwen))
    write("hf_config", "huge.json", json.dumps(dict(llama, vocab_size=2 ** 40, hidden_size=2 ** 31,
                                                    num_hidden_layers=10 ** 6)))
    write("hf_config", "out-of-range.json", json.dumps(dict(llama, rms_norm_eps=1e300, rope_theta=1e300)))
    write("hf_config", "overflow.json", json.dumps(llama).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e999'))
    write("hf_config", "nan-literal.json", json.dumps(llama).replace('"rope_theta": 500000.0', '"rope_theta": NaN'))
    write("hf_config", "duplicate-key.json", json.dumps(llama)[:-1] + ', "rms_norm_eps": -1}')
    # tokenizer.json
    tok = open(os.path.join(HERE, "data/tokenizer.json"), encoding="utf-8").read()
    write("tokenizer_load", "bytelevel.json", tok)
    write("tokenizer_load", "tiny-metaspace.json", json.dumps({
        "added_tokens": [{"id": 5, "content": "<s>", "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                           {"type": "Replace", "pattern": {"String": " "},
                                                            "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                   {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"},
                                                      "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": None, "byte_fallback": True, "fuse_unk": True,
                  "vocab": {"\u2581": 0, "a": 1, "b": 2, "\u2581a": 3, "\u2581b": 4, "<s>": 5, "<0x41>": 6},
                  "merges": ["\u2581 a", "\u2581 b"]}}))
    # a Split pattern that backtracks catastrophically: the encode fails with a named error, fast
    write("tokenizer_load", "catastrophic-split.json", json.dumps({
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(\\w+\\s?)*$|(a|a)+b"}, "behavior": "Isolated",
                          "invert": False},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "H": 2}, "merges": []}}))
    # texts
    for name, text in [("english", "Hello world! The quick brown fox jumps over the lazy dog."),
                       ("special", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>"),
                       ("unicode", "héllo wörld — 日本語 🙂 \u0301e \t\r\n  x"),
                       ("code", "def f(x):\n    return x ** 2  # square\n\n\n"),
                       ("spaces", " " * 64 + "a" * 64)]:
        write("tokenizer_encode", name, text)
    write("tokenizer_encode", "invalid-utf8", b"\xff\xfe\xc3(\xe2\x82 abc \xf0\x9f")
    # jinja
    config = json.load(open(os.path.join(HERE, "data/tokenizer_config.json")))
    write("jinja", "chatml", config["chat_template"])
    llama2 = os.path.join(ROOT, "tests/golden/chat/templates")
    if os.path.isdir(llama2):
        for n in sorted(os.listdir(llama2)):
            write("jinja", "golden-" + n, open(os.path.join(llama2, n), encoding="utf-8").read())
    for name, t in [
        ("filters", "{{ messages | map(attribute='role') | join(', ') }}|{{ items | sort | list }}|"
                    "{{ d | dictsort | tojson }}|{{ 'x' | center(9) }}|{{ n | float | round(2) }}"),
        ("loops", "{% for m in messages %}{{ loop.index }}{% if loop.last %}!{% endif %}{% endfor %}"
                  "{% set ns = namespace(x=0) %}{% for i in range(n) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
        ("macro", "{% macro f(a, b=2) %}{{ a * b }}{% endmacro %}{{ f(3) }}{{ f(1, b=5) }}"),
        ("methods", "{{ 'a,b'.split(',') }}{{ ' x '.strip() }}{{ d.get('a') }}{{ d.items() | list }}"),
        ("tests", "{{ 1 is odd }}{{ none is none }}{{ 'a' in 'abc' }}{{ x is defined }}{{ [] is iterable }}"),
        ("slices", "{{ 'hello'[1:4] }}{{ items[::-1] }}{{ messages[-1]['content'] }}"),
        ("error", "{{ raise_exception('no') }}"),
        ("with-vars", "{{ a.b[0] }}\0{\"a\": {\"b\": [1, 2]}}"),
        ("whitespace", "{%- if true -%}\n  a  \n{%- endif %}{# c #}{% raw %}{{ x }}{% endraw %}"),
        # comparisons are charged to the work budget: sorts in a loop, unique (quadratic), min/max
        ("sort-loop", "{% set l = range(1000)|list|reverse|list %}{% for i in range(100) %}{{ (l|sort)[0] }}"
                      "{{ (l|map('string')|sort(reverse=true))[0] }}{% endfor %}{{ range(300)|list|unique|length }}"
                      "{{ l|min }}{{ l|max }}{{ {'b': 1, 'a': 2}|dictsort }}"),
    ]:
        write("jinja", name, t)
    # data lines: first byte = format (0 tokens, 1 text, 2 alpaca, 3 chat)
    write("data_format", "tokens", b"\x00" + b'{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}')
    write("data_format", "text", b"\x01" + '{"text": "Hello world, the fox."}'.encode())
    write("data_format", "alpaca", b"\x02" + b'{"instruction": "Add", "input": "1 2", "output": "3"}')
    write("data_format", "chat", b"\x03" + json.dumps({"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}]}).encode())
    write("data_format", "bad", b"\x00" + b'{"input_ids": [1, 99999, -5]}')
    # http: first byte = token configuration (0 none, 1 client, 2 view, 3 both)
    for name, req in [
        ("jobs", "\x00GET /api/jobs?state=running&limit=5"),
        ("job", "\x00GET /api/jobs/$JOB"),
        ("metrics", "\x02GET /api/jobs/$JOB/metrics?after_step=0&limit=10\nAuthorization: Bearer vt"),
        ("events", "\x00GET /api/events?after_seq=0&job=$JOB"),
        ("log", "\x00GET /api/jobs/$JOB/log?tail=100"),
        ("cancel", "\x01POST /api/jobs/$JOB/cancel\nAuthorization: Bearer ct\nOrigin: http://h\nHost: h"),
        ("cross-site", "\x01POST /api/jobs/$JOB/cancel\nSec-Fetch-Site: cross-site"),
        ("stream", "\x00GET /api/stream?job=$JOB\nLast-Event-ID: 12"),
        ("page-token", "\x03GET /?token=vt\nCookie: ftune_token=ct"),
        ("prometheus", "\x00GET /metrics"),
        ("escapes", "\x00GET /api/jobs/%2e%2e/x?%zz=1"),
        ("workers", "\x00GET /api/workers"),
        # job ids that must be refused alike by every entry point (common/ids.h)
        ("id-traversal", "\x00GET /api/jobs/..%2F..%2F..%2Fetc%2Fpasswd/log"),
        ("id-absolute", "\x01GET /api/jobs/%2Fetc%2Fpasswd/log\nAuthorization: Bearer ct"),
        ("id-nul", "\x00GET /api/jobs/j-1%00.txt/log"),
        ("id-empty", "\x00GET /api/events?job="),
        ("id-long", "\x00GET /api/jobs/j-" + "1" * 4096 + "/log"),
        ("id-unicode", "\x00GET /api/jobs/j-%D9%A1%D9%A2/log"),
        ("id-dotted", "\x00GET /api/events?job=j-1/../.."),
        ("id-newline", "\x00GET /api/jobs/j-1%0A/events"),
        # browsers: a tokenless cross-site text/plain cancel, DNS rebinding, an allowed host
        ("cancel-text-plain", "\x00POST /api/jobs/$JOB/cancel\nContent-Type: text/plain"),
        ("cancel-json", "\x00POST /api/jobs/$JOB/cancel\nContent-Type: application/json\nHost: [::1]:7071"),
        ("rebinding", "\x00POST /api/jobs/$JOB/cancel\nHost: evil.example:7071\n"
                      "Origin: http://evil.example:7071\nContent-Type: application/json"),
        ("allowed-host", "\x04GET /api/jobs\nHost: H.:7071"),
        # the dashboard serves its assets only, and no answer names the web dir
        ("web-source", "\x00GET /package.json\nHost: 127.0.0.1"),
        ("web-asset", "\x00GET /app.js\nHost: 127.0.0.1"),
        ("web-dotfile", "\x00GET /.gitignore\nHost: 127.0.0.1"),
        ("web-vendor-source", "\x00GET /vendor/LICENSE\nHost: 127.0.0.1"),
    ]:
        write("http_api", name, req)
    session()


if __name__ == "__main__":
    main()
