// Runs docs/learn/check/verify.js under node against vectors the Rust test wrote:
//   node digests.js VECTORS.json
// VECTORS.json: [{"kind": "request"|"result"|"record", "name": …, "protobuf": <base64>, "sha256": …}]
// Also checks the page's own SHA-256, SHA-512 and Ed25519 against node's crypto.
// Prints one line per mismatch and "checked N" at the end; exits 1 on any mismatch.
'use strict';
const fs = require('fs');
const path = require('path');
const nodeCrypto = require('crypto');
const C = require(path.join(__dirname, '../../../../docs/learn/check/verify.js'));

let bad = 0, checked = 0;
function fail(what) { bad++; console.log('MISMATCH ' + what); }

const vectors = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
for (const v of vectors) {
  const bytes = C.fromBase64(v.protobuf, v.name);
  let got;
  try {
    if (v.kind === 'request') got = C.requestDigest(C.decode(bytes, C.schemas.RunRequest, 'request'));
    else if (v.kind === 'result') got = C.resultDigest(C.decode(bytes, C.schemas.RunResponse, 'response'));
    else if (v.kind === 'record') got = C.recordDigest(C.decode(bytes, C.schemas.RunRecord, 'record'));
    else throw new Error('unknown kind ' + v.kind);
  } catch (e) { got = 'error: ' + e.message; }
  if (got !== v.sha256) fail(v.kind + ' ' + JSON.stringify(v.name) + ': JavaScript gives ' + got + ', Rust ' + v.sha256);
  checked++;
}

for (const n of [0, 1, 55, 56, 63, 64, 65, 111, 112, 127, 128, 129, 1000, 70000]) {
  const b = nodeCrypto.randomBytes(n);
  if (C.sha256Hex(b) !== nodeCrypto.createHash('sha256').update(b).digest('hex')) fail('sha256 of ' + n + ' bytes');
  if (C.toHex(C.sha512(b)) !== nodeCrypto.createHash('sha512').update(b).digest('hex')) fail('sha512 of ' + n + ' bytes');
  if (C.toBase64(b) !== b.toString('base64')) fail('base64 of ' + n + ' bytes');
  checked += 3;
}
for (const s of ['Zg', 'Zg=', 'Zh==', 'Z===', 'Zm9v!', 'Zm9']) {
  let threw = false;
  try { C.fromBase64(s, 'x'); } catch (e) { threw = true; }
  if (!threw) fail('base64 ' + JSON.stringify(s) + ' was accepted');
  checked++;
}
for (let i = 0; i < 8; i++) {
  const { publicKey, privateKey } = nodeCrypto.generateKeyPairSync('ed25519');
  const raw = publicKey.export({ type: 'spki', format: 'der' }).subarray(12);
  const msg = nodeCrypto.randomBytes(100 * i);
  const sig = nodeCrypto.sign(null, msg, privateKey);
  if (!C.ed25519VerifyJs(raw, msg, sig)) fail('ed25519: a good signature was refused');
  const s2 = Buffer.from(sig); s2[i * 7] ^= 1;
  if (C.ed25519VerifyJs(raw, msg, s2)) fail('ed25519: a changed signature was accepted');
  if (msg.length) { const m2 = Buffer.from(msg); m2[0] ^= 0x80; if (C.ed25519VerifyJs(raw, m2, sig)) fail('ed25519: a changed message was accepted'); }
  checked += 3;
}
console.log('checked ' + checked);
process.exit(bad ? 1 : 0);
