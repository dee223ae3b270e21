// Verifies a bundle with docs/learn/check/verify.js under node, as the page does:
//   node bundle.js BUNDLE.jsonl KEY.pub [js|webcrypto]
// Prints the report as JSON: {ok, reason, engine, lines: [[n, kind, ok, reason], …]}.
//   node bundle.js --many CASES.json KEY.pub
// CASES.json is a list of bundles (each a list of lines); prints one report per line of output.
'use strict';
const fs = require('fs');
const path = require('path');
const C = require(path.join(__dirname, '../../../../docs/learn/check/verify.js'));

async function many() {
  const cases = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));
  const key = fs.readFileSync(process.argv[4], 'utf8');
  const ed = await C.pickEd25519('');
  for (const lines of cases) {
    const report = await C.verifyBundle(lines, key, ed.verify);
    const first = report.lines.find((l) => !l.ok);
    console.log(JSON.stringify({ ok: report.ok, first_bad: first ? first.n : null, reason: report.reason }));
  }
}

(async () => {
  if (process.argv[2] === '--many') return many();
  const text = fs.readFileSync(process.argv[2], 'utf8');
  const lines = text.split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  const ed = await C.pickEd25519(process.argv[4] === 'js' ? 'js' : '');
  const report = await C.verifyBundle(lines, fs.readFileSync(process.argv[3], 'utf8'), ed.verify);
  console.log(JSON.stringify({ ok: report.ok, reason: report.reason, engine: ed.engine,
    lines: report.lines.map((l) => [l.n, l.kind, l.ok, l.reason]) }));
})().catch((e) => { console.log(JSON.stringify({ error: e.message })); process.exit(2); });
