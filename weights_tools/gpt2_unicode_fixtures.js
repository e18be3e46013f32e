#!/usr/bin/env node
// Writes, from Hugging Face `tokenizers` (the npm binding, exactly version
// 0.23.2), the Unicode character classes that the GPT-2 pre-tokenizer uses and
// test encodings over the code points whose class changed since Unicode 14:
//
//   tests/fixtures/gpt2-tokenizer/unicode_classes.txt
//       the class of every code point U+0000..U+10FFFF (surrogates excluded)
//       as HF's ByteLevel regex sees it: L (\p{L}), N (\p{N}), W (\s), or
//       none of these (not listed)
//   tests/fixtures/gpt2-tokenizer/hf_unicode16_encodings.jsonl
//       1,000 random strings over the changed code points, followed by
//       contractions, with HF's ids
//   engine/tokenizer/gpt2_char_class_ranges.inc
//       the same table as C++ initializers, compiled into the engine
//
// HF is only observed, never asked for its tables: each code point c is
// pre-tokenized in four probes, "a"+c, "0"+c, "!"+c and "\t"+c, and exactly
// one of them must stay one piece (c continues a letter run, a number run, a
// run of other characters, or a whitespace run at the end of the text).
//
// "Changed since Unicode 14" is judged by Debian 12's /usr/bin/python3
// (3.11, unicodedata 14.0.0, the same Unicode version as Debian 12's PCRE2
// 10.42, which the pre-tokenizer used before).
//
// Usage (docs/tokenizer.md), about 25 s:
//   mkdir -p /tmp/hf && cd /tmp/hf && npm install tokenizers@0.23.2
//   cd REPO && NODE_PATH=/tmp/hf/node_modules node weights_tools/gpt2_unicode_fixtures.js
'use strict';

const fs = require('fs');
const path = require('path');
const childProcess = require('child_process');

const kTokenizersVersion = '0.23.2';
const kRepo = path.resolve(__dirname, '..');
const kFixtureDir = path.join(kRepo, 'tests/fixtures/gpt2-tokenizer');
const kTablePath = path.join(kFixtureDir, 'unicode_classes.txt');
const kEncodingsPath = path.join(kFixtureDir, 'hf_unicode16_encodings.jsonl');
const kIncPath = path.join(kRepo, 'engine/tokenizer/gpt2_char_class_ranges.inc');
const kMaxCodePoint = 0x10ffff;
const kRandomStrings = 1000;
const kSeed = 15;

function loadTokenizers() {
  const version = require('tokenizers/package.json').version;
  if (version !== kTokenizersVersion) {
    throw new Error(`need tokenizers ${kTokenizersVersion}, found ${version}`);
  }
  return require('tokenizers');
}

const isSurrogate = (cp) => cp >= 0xd800 && cp <= 0xdfff;
const hex = (cp) => cp.toString(16).toUpperCase().padStart(4, '0');

// The class ('L', 'N', 'W' or '-') of every code point, by probing HF.
function probeClasses(tokenizers) {
  const pre = tokenizers.byteLevelPreTokenizer(/*addPrefixSpace=*/ false, /*useRegex=*/ true);
  const onePiece = (s) => pre.preTokenizeString(s).length === 1;
  const probes = [['a', 'L'], ['0', 'N'], ['!', '-'], ['\t', 'W']];
  const classes = new Array(kMaxCodePoint + 1).fill(null);
  for (let cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (isSurrogate(cp)) continue;
    const c = String.fromCodePoint(cp);
    const hits = probes.filter(([prefix]) => onePiece(prefix + c)).map(([, cls]) => cls);
    if (hits.length !== 1) throw new Error(`U+${hex(cp)}: probes give ${JSON.stringify(hits)}`);
    classes[cp] = hits[0];
  }
  return classes;
}

// Maximal runs of one class other than '-': [start, end, class].
function toRanges(classes) {
  const ranges = [];
  for (let cp = 0; cp <= kMaxCodePoint; ++cp) {
    const cls = classes[cp];
    if (cls === null || cls === '-') continue;
    const last = ranges[ranges.length - 1];
    if (last && last[1] === cp - 1 && last[2] === cls) {
      last[1] = cp;
    } else {
      ranges.push([cp, cp, cls]);
    }
  }
  return ranges;
}

// L / N / '-' by Unicode 14 general categories (Python's unicodedata).
function unicode14Classes() {
  const script = [
    'import sys, unicodedata',
    'assert unicodedata.unidata_version == "14.0.0", unicodedata.unidata_version',
    'out = []',
    'for cp in range(0x110000):',
    '    cat = unicodedata.category(chr(cp))[0]',
    '    out.append(cat if cat in "LN" else "-")',
    'sys.stdout.write("".join(out))',
  ].join('\n');
  const text = childProcess.execFileSync('/usr/bin/python3', ['-c', script], {
    maxBuffer: 4 << 20,
    encoding: 'latin1',
  });
  if (text.length !== kMaxCodePoint + 1) throw new Error('unexpected python output');
  return text;
}

// Deterministic 32-bit PRNG (mulberry32), so the fixture is reproducible.
function makeRng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Random strings in which changed code points (runs of 1-3, sometimes after
// a space) are followed by contractions, with a little surrounding text. A
// code point is drawn from a uniformly chosen changed range, so that small
// ranges (digits, small scripts) are not drowned by the large CJK and
// hieroglyph blocks.
function randomStrings(changedRanges, count) {
  const rng = makeRng(kSeed);
  const pick = (list) => list[Math.floor(rng() * list.length)];
  const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"];
  const notContractions = ["'S", "'T", "'", "''s", "'x"];
  const fillers = [' ', '', '\n', '  ', ' a', 'x', '1', '42', '.', ', ', '\u4e00', '\u0301',
                   '\u3000', '\u00e9', '\u{1F600}', ' \u0663'];
  const strings = [];
  for (let i = 0; i < count; ++i) {
    let text = '';
    const segments = 1 + Math.floor(rng() * 3);
    for (let s = 0; s < segments; ++s) {
      if (rng() < 0.3) text += ' ';
      const run = 1 + Math.floor(rng() * 3);
      for (let k = 0; k < run; ++k) {
        const [first, last] = pick(changedRanges);
        text += String.fromCodePoint(first + Math.floor(rng() * (last - first + 1)));
      }
      text += rng() < 0.9 ? pick(contractions) : pick(notContractions);
      text += pick(fillers);
    }
    strings.push(text);
  }
  return strings;
}

function writeTable(ranges, counts) {
  const lines = [
    '# The class of every code point U+0000..U+10FFFF (surrogates excluded) as the',
    `# GPT-2 pre-tokenizer regex of Hugging Face tokenizers ${kTokenizersVersion} sees it:`,
    '# L = \\p{L}, N = \\p{N}, W = \\s; a code point not listed is none of these.',
    '# Generated by weights_tools/gpt2_unicode_fixtures.js (docs/tokenizer.md); do not edit.',
    `# Code points: L ${counts.L}, N ${counts.N}, W ${counts.W}.`,
  ];
  for (const [start, end, cls] of ranges) {
    lines.push(start === end ? `${hex(start)} ${cls}` : `${hex(start)}..${hex(end)} ${cls}`);
  }
  fs.writeFileSync(kTablePath, lines.join('\n') + '\n');
}

function writeInc(ranges) {
  const kinds = {L: 'kLetter', N: 'kNumber', W: 'kWhitespace'};
  const lines = [
    `// Generated by weights_tools/gpt2_unicode_fixtures.js from Hugging Face tokenizers`,
    `// ${kTokenizersVersion} (Unicode 16.0); do not edit. {first, last, class}, sorted.`,
  ];
  for (const [start, end, cls] of ranges) {
    lines.push(`{0x${hex(start)}, 0x${hex(end)}, CharClass::${kinds[cls]}},`);
  }
  fs.writeFileSync(kIncPath, lines.join('\n') + '\n');
}

async function main() {
  const tokenizers = loadTokenizers();

  const classes = probeClasses(tokenizers);
  const ranges = toRanges(classes);
  const counts = {L: 0, N: 0, W: 0, '-': 0};
  for (const cls of classes) if (cls !== null) ++counts[cls];
  writeTable(ranges, counts);
  writeInc(ranges);
  console.log(`classes: ${ranges.length} ranges; ${JSON.stringify(counts)}`);

  // For information: how HF differs from this Node's own RegExp tables.
  const v8 = (cp) => {
    const c = String.fromCodePoint(cp);
    return /\p{L}/u.test(c) ? 'L' : /\p{N}/u.test(c) ? 'N' : /\s/u.test(c) ? 'W' : '-';
  };
  let v8Differences = 0;
  for (let cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (classes[cp] !== null && classes[cp] !== v8(cp)) ++v8Differences;
  }
  console.log(`differ from node's RegExp (Unicode ${process.versions.unicode}): ${v8Differences}`);

  const old = unicode14Classes();
  // Code points whose L / N class differs, in ranges labelled by today's class.
  const changedClasses = classes.map((now, cp) => {
    if (now === null) return null;
    const nowLN = now === 'L' || now === 'N' ? now : '-';
    return nowLN === old[cp] ? null : now === '-' ? 'O' : now;
  });
  const changedRanges = toRanges(changedClasses);
  const changedCount = changedRanges.reduce((n, [first, last]) => n + last - first + 1, 0);
  console.log(`changed since Unicode 14: ${changedCount} code points in ${changedRanges.length} ` +
              `ranges: ${changedRanges.map(([f, l, c]) => `${hex(f)}..${hex(l)} ${c}`).join(', ')}`);

  const tokenizer = tokenizers.Tokenizer.fromFile(path.join(kFixtureDir, 'tokenizer.json'));
  const encode = async (text) =>
    (await tokenizer.encode(text, null, {addSpecialTokens: false})).getIds();
  const lines = [];
  for (const text of randomStrings(changedRanges, kRandomStrings)) {
    lines.push(JSON.stringify({text, ids: await encode(text)}));
  }
  fs.writeFileSync(kEncodingsPath, lines.join('\n') + '\n');
  for (const text of ['\u{11F0B}\'t', '\u{31350}\'s']) {
    console.log(`${JSON.stringify(text)} -> ${JSON.stringify(await encode(text))}`);
  }
}

main().catch((error) => {
  console.error(error.message);
  process.exit(1);
});
