/*
 * plimsoll record checker: a second, independent implementation of the run-record
 * digests (docs/records.md) and of the bundle rules (docs/attest.md), in plain JavaScript
 * with no dependency and no network.
 *
 * It recomputes, from the bytes a bundle stores:
 *   - the request digest  (domain plimsoll.run-request.v2 / .v1) from the RunRequest protobuf,
 *   - the result digest   (domain plimsoll.run-result.v1) from the RunResponse protobuf,
 *   - the record digest   (domain plimsoll.run-record.v<version>) from the signed record,
 *   - the DSSE Ed25519 signatures (WebCrypto when the browser has Ed25519, otherwise the
 *     small pure-JS verifier below),
 *   - the bundle's links (each line names the SHA-256 of the line before it and of its own
 *     content) and its checkpoints.
 *
 * The same file runs in a page (it sets window.PlimsollCheck) and under node (module.exports),
 * where the repository's tests feed it the golden vectors.
 *
 * Nothing here shares code with the Rust implementation: protobuf wire decoding, SHA-256,
 * SHA-512 and Ed25519 are written out from their specifications (FIPS 180-4, RFC 8032).
 */
(function (root) {
  'use strict';

  // ---------------------------------------------------------------- bytes and text
  var textEncoder = new TextEncoder();
  var strictUtf8 = new TextDecoder('utf-8', { fatal: true });
  function utf8(s) { return textEncoder.encode(s); }
  function fromUtf8(b, what) {
    try { return strictUtf8.decode(b); } catch (e) { throw new Error(what + ' is not valid UTF-8'); }
  }
  function concat(parts) {
    if (parts.length === 1) return parts[0];
    var n = 0, i;
    for (i = 0; i < parts.length; i++) n += parts[i].length;
    var out = new Uint8Array(n), at = 0;
    for (i = 0; i < parts.length; i++) { out.set(parts[i], at); at += parts[i].length; }
    return out;
  }
  function toHex(b) {
    var s = '';
    for (var i = 0; i < b.length; i++) s += (b[i] < 16 ? '0' : '') + b[i].toString(16);
    return s;
  }
  function equalBytes(a, b) {
    if (a.length !== b.length) return false;
    for (var i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
    return true;
  }

  var B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  var B64INV = {};
  for (var bi = 0; bi < 64; bi++) B64INV[B64[bi]] = bi;
  /** Standard padded base64, strictly: the alphabet, the padding and zero trailing bits. */
  function fromBase64(s, what) {
    if (s.length % 4 !== 0) throw new Error(what + ' is not std base64 (length ' + s.length + ')');
    var pad = s.endsWith('==') ? 2 : s.endsWith('=') ? 1 : 0;
    var out = new Uint8Array(s.length / 4 * 3 - pad), o = 0;
    for (var i = 0; i < s.length; i += 4) {
      var v = 0;
      for (var j = 0; j < 4; j++) {
        var c = s[i + j];
        var d = B64INV[c];
        if (d === undefined) {
          if (c === '=' && i + 4 === s.length && j >= 4 - pad) d = 0;
          else throw new Error(what + ' is not std base64 (character ' + (i + j) + ')');
        }
        v = v * 64 + d;
      }
      var bytes = [(v >>> 16) & 255, (v >>> 8) & 255, v & 255];
      var keep = i + 4 === s.length ? 3 - pad : 3;
      if (keep < 3 && bytes.slice(keep).some(function (x) { return x !== 0; })) {
        throw new Error(what + ' is not std base64 (trailing bits)');
      }
      for (var k = 0; k < keep; k++) out[o++] = bytes[k];
    }
    return out;
  }
  function toBase64(b) {
    var s = '';
    for (var i = 0; i < b.length; i += 3) {
      var n = (b[i] << 16) | ((b[i + 1] || 0) << 8) | (b[i + 2] || 0);
      s += B64[(n >>> 18) & 63] + B64[(n >>> 12) & 63];
      s += i + 1 < b.length ? B64[(n >>> 6) & 63] : '=';
      s += i + 2 < b.length ? B64[n & 63] : '=';
    }
    return s;
  }

  // ---------------------------------------------------------------- SHA-256 (FIPS 180-4)
  var K256 = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);

  /** An incremental SHA-256: update(bytes) as often as needed, then digest(). */
  function Sha256() {
    this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    this.buf = new Uint8Array(64);
    this.fill = 0;
    this.total = 0;
    this.w = new Uint32Array(64);
  }
  Sha256.prototype.block = function (b, at) {
    var w = this.w, h = this.h, i;
    for (i = 0; i < 16; i++) {
      w[i] = (b[at + 4 * i] << 24) | (b[at + 4 * i + 1] << 16) | (b[at + 4 * i + 2] << 8) | b[at + 4 * i + 3];
    }
    for (i = 16; i < 64; i++) {
      var x = w[i - 15], y = w[i - 2];
      var s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      var s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    var a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (i = 0; i < 64; i++) {
      var S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      var ch = (e & f) ^ (~e & g);
      var t1 = (hh + S1 + ch + K256[i] + w[i]) | 0;
      var S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      var maj = (a & bb) ^ (a & c) ^ (bb & c);
      var t2 = (S0 + maj) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  };
  Sha256.prototype.update = function (b) {
    var i = 0;
    this.total += b.length;
    if (this.fill > 0) {
      while (i < b.length && this.fill < 64) this.buf[this.fill++] = b[i++];
      if (this.fill < 64) return this;
      this.block(this.buf, 0);
      this.fill = 0;
    }
    for (; i + 64 <= b.length; i += 64) this.block(b, i);
    while (i < b.length) this.buf[this.fill++] = b[i++];
    return this;
  };
  Sha256.prototype.digest = function () {
    var bits = this.total * 8;
    var tail = new Uint8Array(((this.fill < 56) ? 64 : 128) - this.fill);
    tail[0] = 0x80;
    var n = tail.length;
    var hi = Math.floor(bits / 0x100000000), lo = bits >>> 0;
    tail[n - 8] = hi >>> 24; tail[n - 7] = hi >>> 16; tail[n - 6] = hi >>> 8; tail[n - 5] = hi;
    tail[n - 4] = lo >>> 24; tail[n - 3] = lo >>> 16; tail[n - 2] = lo >>> 8; tail[n - 1] = lo;
    this.update(tail);
    var out = new Uint8Array(32);
    for (var i = 0; i < 8; i++) {
      out[4 * i] = this.h[i] >>> 24; out[4 * i + 1] = this.h[i] >>> 16;
      out[4 * i + 2] = this.h[i] >>> 8; out[4 * i + 3] = this.h[i];
    }
    return out;
  };
  function sha256(b) { return new Sha256().update(b).digest(); }
  function sha256Hex(b) { return toHex(sha256(b)); }

  // ---------------------------------------------------------------- SHA-512 (for Ed25519)
  var M64 = (1n << 64n) - 1n;
  var K512 = ['428a2f98d728ae22', '7137449123ef65cd', 'b5c0fbcfec4d3b2f', 'e9b5dba58189dbbc',
    '3956c25bf348b538', '59f111f1b605d019', '923f82a4af194f9b', 'ab1c5ed5da6d8118', 'd807aa98a3030242',
    '12835b0145706fbe', '243185be4ee4b28c', '550c7dc3d5ffb4e2', '72be5d74f27b896f', '80deb1fe3b1696b1',
    '9bdc06a725c71235', 'c19bf174cf692694', 'e49b69c19ef14ad2', 'efbe4786384f25e3', '0fc19dc68b8cd5b5',
    '240ca1cc77ac9c65', '2de92c6f592b0275', '4a7484aa6ea6e483', '5cb0a9dcbd41fbd4', '76f988da831153b5',
    '983e5152ee66dfab', 'a831c66d2db43210', 'b00327c898fb213f', 'bf597fc7beef0ee4', 'c6e00bf33da88fc2',
    'd5a79147930aa725', '06ca6351e003826f', '142929670a0e6e70', '27b70a8546d22ffc', '2e1b21385c26c926',
    '4d2c6dfc5ac42aed', '53380d139d95b3df', '650a73548baf63de', '766a0abb3c77b2a8', '81c2c92e47edaee6',
    '92722c851482353b', 'a2bfe8a14cf10364', 'a81a664bbc423001', 'c24b8b70d0f89791', 'c76c51a30654be30',
    'd192e819d6ef5218', 'd69906245565a910', 'f40e35855771202a', '106aa07032bbd1b8', '19a4c116b8d2d0c8',
    '1e376c085141ab53', '2748774cdf8eeb99', '34b0bcb5e19b48a8', '391c0cb3c5c95a63', '4ed8aa4ae3418acb',
    '5b9cca4f7763e373', '682e6ff3d6b2b8a3', '748f82ee5defb2fc', '78a5636f43172f60', '84c87814a1f0ab72',
    '8cc702081a6439ec', '90befffa23631e28', 'a4506cebde82bde9', 'bef9a3f7b2c67915', 'c67178f2e372532b',
    'ca273eceea26619c', 'd186b8c721c0c207', 'eada7dd6cde0eb1e', 'f57d4f7fee6ed178', '06f067aa72176fba',
    '0a637dc5a2c898a6', '113f9804bef90dae', '1b710b35131c471b', '28db77f523047d84', '32caab7b40c72493',
    '3c9ebe0a15c9bebc', '431d67c49c100d4c', '4cc5d4becb3e42b6', '597f299cfc657e2a', '5fcb6fab3ad6faec',
    '6c44198c4a475817'].map(function (x) { return BigInt('0x' + x); });
  var IV512 = ['6a09e667f3bcc908', 'bb67ae8584caa73b', '3c6ef372fe94f82b', 'a54ff53a5f1d36f1',
    '510e527fade682d1', '9b05688c2b3e6c1f', '1f83d9abfb41bd6b', '5be0cd19137e2179']
    .map(function (x) { return BigInt('0x' + x); });
  function rotr64(x, n) { return ((x >> n) | (x << (64n - n))) & M64; }
  function sha512(msg) {
    var len = msg.length;
    var padded = new Uint8Array(((len + 17 + 127) >> 7) << 7);
    padded.set(msg);
    padded[len] = 0x80;
    var bits = BigInt(len) * 8n;
    for (var i = 0; i < 16; i++) padded[padded.length - 1 - i] = Number((bits >> BigInt(8 * i)) & 255n);
    var h = IV512.slice(), w = new Array(80);
    for (var at = 0; at < padded.length; at += 128) {
      var t;
      for (t = 0; t < 16; t++) {
        var v = 0n;
        for (var k = 0; k < 8; k++) v = (v << 8n) | BigInt(padded[at + 8 * t + k]);
        w[t] = v;
      }
      for (t = 16; t < 80; t++) {
        var s0 = rotr64(w[t - 15], 1n) ^ rotr64(w[t - 15], 8n) ^ (w[t - 15] >> 7n);
        var s1 = rotr64(w[t - 2], 19n) ^ rotr64(w[t - 2], 61n) ^ (w[t - 2] >> 6n);
        w[t] = (w[t - 16] + s0 + w[t - 7] + s1) & M64;
      }
      var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
      for (t = 0; t < 80; t++) {
        var S1 = rotr64(e, 14n) ^ rotr64(e, 18n) ^ rotr64(e, 41n);
        var ch = (e & f) ^ (~e & M64 & g);
        var t1 = (hh + S1 + ch + K512[t] + w[t]) & M64;
        var S0 = rotr64(a, 28n) ^ rotr64(a, 34n) ^ rotr64(a, 39n);
        var maj = (a & b) ^ (a & c) ^ (b & c);
        var t2 = (S0 + maj) & M64;
        hh = g; g = f; f = e; e = (d + t1) & M64; d = c; c = b; b = a; a = (t1 + t2) & M64;
      }
      h[0] = (h[0] + a) & M64; h[1] = (h[1] + b) & M64; h[2] = (h[2] + c) & M64; h[3] = (h[3] + d) & M64;
      h[4] = (h[4] + e) & M64; h[5] = (h[5] + f) & M64; h[6] = (h[6] + g) & M64; h[7] = (h[7] + hh) & M64;
    }
    var out = new Uint8Array(64);
    for (var j = 0; j < 8; j++) {
      for (var q = 0; q < 8; q++) out[8 * j + q] = Number((h[j] >> BigInt(56 - 8 * q)) & 255n);
    }
    return out;
  }

  // ---------------------------------------------------------------- Ed25519 verify (RFC 8032)
  var P = (1n << 255n) - 19n;
  var L = (1n << 252n) + 27742317777372353535851937790883648493n;
  function md(a, m) { m = m || P; var r = a % m; return r >= 0n ? r : r + m; }
  function pow(b, e, m) {
    m = m || P;
    var r = 1n;
    b = md(b, m);
    while (e > 0n) { if (e & 1n) r = r * b % m; b = b * b % m; e >>= 1n; }
    return r;
  }
  function inv(a) { return pow(a, P - 2n); }
  var D = md(-121665n * inv(121666n));
  var SQRT_M1 = pow(2n, (P - 1n) / 4n);
  function leToBig(b) { var r = 0n; for (var i = b.length - 1; i >= 0; i--) r = (r << 8n) | BigInt(b[i]); return r; }
  function bigToLe(x, n) { var out = new Uint8Array(n); for (var i = 0; i < n; i++) { out[i] = Number(x & 255n); x >>= 8n; } return out; }
  // Extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z; the addition law
  // "add-2008-hwcd-3" is complete on this curve (a = -1, d not a square), so it doubles too.
  function padd(p, q) {
    var A = md((p[1] - p[0]) * (q[1] - q[0])), B = md((p[1] + p[0]) * (q[1] + q[0]));
    var C = md(2n * D * p[3] * q[3]), DD = md(2n * p[2] * q[2]);
    var E = B - A, F = DD - C, G = DD + C, H = B + A;
    return [md(E * F), md(G * H), md(F * G), md(E * H)];
  }
  function pmul(p, n) {
    var r = [0n, 1n, 1n, 0n];
    while (n > 0n) { if (n & 1n) r = padd(r, p); p = padd(p, p); n >>= 1n; }
    return r;
  }
  function pneg(p) { return [md(-p[0]), p[1], p[2], md(-p[3])]; }
  function decodePoint(b) {
    if (b.length !== 32) return null;
    var sign = b[31] >> 7;
    var yb = Uint8Array.from(b); yb[31] &= 0x7f;
    var y = leToBig(yb);
    if (y >= P) return null;
    var u = md(y * y - 1n), v = md(D * y * y + 1n);
    var x = md(u * pow(v, 3n) * pow(u * pow(v, 7n), (P - 5n) / 8n));
    var vx2 = md(v * x * x);
    if (vx2 !== u) {
      if (vx2 === md(-u)) x = md(x * SQRT_M1); else return null;
    }
    if (x === 0n && sign === 1) return null;
    if (Number(x & 1n) !== sign) x = P - x;
    return [x, y, 1n, md(x * y)];
  }
  function encodePoint(p) {
    var zi = inv(p[2]);
    var x = md(p[0] * zi), y = md(p[1] * zi);
    var b = bigToLe(y, 32);
    b[31] |= Number(x & 1n) << 7;
    return b;
  }
  var BASE = decodePoint(fromBase64('WGZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY=', 'base point'));
  /** Pure-JS Ed25519 verification (cofactorless, R compared as encoded, s < L). */
  function ed25519VerifyJs(pub, msg, sig) {
    if (pub.length !== 32 || sig.length !== 64) return false;
    var A = decodePoint(pub);
    if (!A) return false;
    var s = leToBig(sig.subarray(32));
    if (s >= L) return false;
    var h = md(leToBig(sha512(concat([sig.subarray(0, 32), pub, msg]))), L);
    var r = padd(pmul(BASE, s), pneg(pmul(A, h)));
    return equalBytes(encodePoint(r), sig.subarray(0, 32));
  }

  // ---------------------------------------------------------------- the public key
  var SPKI_PREFIX = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
  /** An Ed25519 SPKI PEM (`PUBLIC KEY`): raw key, DER, and key id (hex SHA-256 of the DER). */
  function parsePublicKey(pem) {
    var m = /-----BEGIN PUBLIC KEY-----([\s\S]*?)-----END PUBLIC KEY-----/.exec(pem);
    if (!m) throw new Error('the key is not a PEM PUBLIC KEY');
    var der = fromBase64(m[1].replace(/\s+/g, ''), 'the key');
    if (der.length !== 44 || SPKI_PREFIX.some(function (x, i) { return der[i] !== x; })) {
      throw new Error('the key is not an Ed25519 public key');
    }
    return { raw: der.slice(12), der: der, id: sha256Hex(der) };
  }

  // ---------------------------------------------------------------- protobuf wire format
  // A schema maps a field number to [name, type] (type: a scalar name or a schema), with
  // `rep` for repeated fields and `oneof` naming the oneof a field belongs to.
  function F(name, type, opts) { return { name: name, type: type, rep: !!(opts && opts.rep), oneof: opts && opts.oneof }; }
  var S = {};
  S.SoftwareRule = { 1: F('mode', 'string'), 2: F('identities', 'string', { rep: true }) };
  S.JavaScriptRun = { 1: F('code', 'string'), 2: F('grant_profile', 'string') };
  S.ProjectFile = { 1: F('path', 'string'), 2: F('content', 'string') };
  S.ProjectRun = { 1: F('files', S.ProjectFile, { rep: true }), 2: F('steps', 'string', { rep: true }),
    4: F('artifacts', 'string', { rep: true }), 5: F('grant_profile', 'string') };
  S.ModuleRow = { 1: F('values', 'double', { rep: true }) };
  S.ModuleRun = { 1: F('model', 'string'), 2: F('rows', S.ModuleRow, { rep: true }), 3: F('end_time', 'double'), 4: F('step', 'double') };
  S.CellRun = { 1: F('language', 'string'), 2: F('code', 'string'), 3: F('files', S.ProjectFile, { rep: true }) };
  S.RunRequest = { 1: F('protocol', 'uint32'), 2: F('minimum_isolation', 'string'), 3: F('trace_id', 'string'),
    4: F('timeout_ms', 'int32'), 5: F('software_rule', S.SoftwareRule),
    10: F('javascript', S.JavaScriptRun, { oneof: 'payload' }), 11: F('project', S.ProjectRun, { oneof: 'payload' }),
    12: F('module', S.ModuleRun, { oneof: 'payload' }), 13: F('cell', S.CellRun, { oneof: 'payload' }) };
  S.AdviceFinding = { 1: F('pattern', 'string'), 2: F('severity', 'string'), 3: F('remedy', 'string'),
    4: F('method', 'string'), 5: F('route', 'string'), 6: F('detail', 'string'), 7: F('suggested_method', 'string'),
    8: F('suggested_route', 'string'), 9: F('extra_calls', 'int32'), 10: F('added_latency_ms', 'int64'),
    11: F('bytes_moved', 'int64') };
  S.JavaScriptResult = { 1: F('stdout', 'bytes'), 2: F('stderr', 'bytes'), 3: F('exit_code', 'int32'),
    4: F('timed_out', 'bool'), 8: F('stdout_truncated', 'bool'), 9: F('stderr_truncated', 'bool'),
    10: F('advice', S.AdviceFinding, { rep: true }) };
  S.StepResult = { 1: F('command', 'string'), 2: F('stdout', 'bytes'), 3: F('stderr', 'bytes'), 4: F('exit_code', 'int32'),
    5: F('timed_out', 'bool'), 6: F('duration_ms', 'int64'), 7: F('stdout_truncated', 'bool'), 8: F('stderr_truncated', 'bool') };
  S.Artifact = { 1: F('path', 'string'), 2: F('content', 'bytes') };
  S.ProjectResult = { 1: F('steps', S.StepResult, { rep: true }), 3: F('outcome', 'int32'),
    4: F('artifacts', S.Artifact, { rep: true }), 6: F('outcome_detail', 'string'), 7: F('artifacts_truncated', 'bool'),
    8: F('advice', S.AdviceFinding, { rep: true }) };
  S.ModuleRowResult = { 1: F('status', 'int32'), 2: F('outputs', 'double', { rep: true }) };
  S.ModuleResult = { 1: F('runs', S.ModuleRowResult, { rep: true }), 2: F('width', 'int32'), 5: F('outcome', 'int32'),
    6: F('outcome_detail', 'string'), 7: F('stdout', 'bytes'), 8: F('stderr', 'bytes') };
  S.CellResult = { 1: F('stdout', 'bytes'), 2: F('stderr', 'bytes'), 3: F('exit_code', 'int32'), 4: F('timed_out', 'bool'),
    5: F('stdout_truncated', 'bool'), 6: F('stderr_truncated', 'bool'), 7: F('interpreter_started', 'bool'),
    8: F('interpreter_ended', 'bool') };
  S.RunRecord = { 1: F('version', 'uint32'), 2: F('request_sha256', 'string'), 3: F('result_sha256', 'string'),
    4: F('provider', 'string'), 5: F('isolation', 'string'), 6: F('environment', 'string'), 7: F('policy', 'string'),
    8: F('started_unix_ms', 'int64'), 9: F('ended_unix_ms', 'int64'), 10: F('session', 'string'),
    11: F('sequence', 'uint64'), 12: F('previous_sha256', 'string'), 13: F('record_sha256', 'string'),
    14: F('software_identity', 'string'), 15: F('software_rule_id', 'string'), 16: F('unanswered', 'string') };
  S.RunResponse = { 1: F('sandbox', 'string'), 2: F('isolation', 'string'), 3: F('duration_ms', 'int64'),
    4: F('record', S.RunRecord), 5: F('software_identity', 'string'), 6: F('environment', 'string'),
    10: F('javascript', S.JavaScriptResult, { oneof: 'result' }), 11: F('project', S.ProjectResult, { oneof: 'result' }),
    12: F('module', S.ModuleResult, { oneof: 'result' }), 13: F('cell', S.CellResult, { oneof: 'result' }) };

  var WIRE = { uint32: 0, int32: 0, int64: 0, uint64: 0, bool: 0, double: 1, string: 2, bytes: 2 };
  function zeroOf(f) {
    if (f.rep) return [];
    if (typeof f.type === 'object') return null;
    switch (f.type) {
      case 'string': return '';
      case 'bytes': return new Uint8Array(0);
      case 'bool': return false;
      case 'double': return new Uint8Array(8);
      default: return 0n;
    }
  }
  /** Splits a message into its fields: [{n, wt, v}] (v: BigInt varint, or the bytes). */
  function wireFields(b) {
    var i = 0, out = [];
    function varint() {
      var r = 0n, shift = 0n;
      for (var k = 0; k < 10; k++) {
        if (i >= b.length) throw new Error('truncated varint');
        var c = b[i++];
        r |= BigInt(c & 0x7f) << shift;
        if (!(c & 0x80)) return r & M64;
        shift += 7n;
      }
      throw new Error('varint longer than 10 bytes');
    }
    function take(n) {
      if (n > b.length - i) throw new Error('a field runs past the end of the message');
      var v = b.subarray(i, i + n);
      i += n;
      return v;
    }
    while (i < b.length) {
      var key = varint();
      var n = key >> 3n, wt = Number(key & 7n);
      if (n === 0n || n > 0x1fffffffn) throw new Error('invalid field number ' + n);
      var v;
      if (wt === 0) v = varint();
      else if (wt === 1) v = take(8);
      else if (wt === 2) { var len = varint(); if (len > BigInt(b.length)) throw new Error('a length runs past the end of the message'); v = take(Number(len)); }
      else if (wt === 5) v = take(4);
      else throw new Error('unsupported wire type ' + wt);
      out.push({ n: Number(n), wt: wt, v: v });
    }
    return out;
  }
  function scalar(type, wt, v, name) {
    if (wt !== WIRE[type]) throw new Error(name + ': wire type ' + wt + ' where ' + type + ' wants ' + WIRE[type]);
    switch (type) {
      case 'uint32': return BigInt.asUintN(32, v);
      case 'int32': return BigInt.asIntN(32, v);
      case 'int64': return BigInt.asIntN(64, v);
      case 'uint64': return v;
      case 'bool': return v !== 0n;
      case 'double': return v;
      case 'string': return { text: fromUtf8(v, name), bytes: v };
      case 'bytes': return v;
    }
    throw new Error('unknown type ' + type);
  }
  /**
   * Decodes `b` with `schema` the way proto3 does: unknown fields skipped, the last value of a
   * scalar wins, repeated doubles packed or not (each kept as its 8 wire bytes), a message field given twice merged, and in
   * a oneof the last member given wins. Strings keep their bytes: digests hash those.
   */
  function decode(b, schema, path) {
    path = path || 'message';
    var msg = {}, parts = {}, oneofs = {}, n;
    for (n in schema) {
      var z = zeroOf(schema[n]);
      if (schema[n].type === 'string' && !schema[n].rep) z = { text: '', bytes: new Uint8Array(0) };
      msg[schema[n].name] = z;
    }
    var fields = wireFields(b);
    for (var k = 0; k < fields.length; k++) {
      var fw = fields[k], f = schema[fw.n];
      if (!f) continue;
      var name = path + '.' + f.name;
      if (typeof f.type === 'object') {
        if (fw.wt !== 2) throw new Error(name + ': wire type ' + fw.wt + ' where a message wants 2');
        if (f.rep) { msg[f.name].push(decode(fw.v, f.type, name)); continue; }
        if (f.oneof) {
          if (oneofs[f.oneof] !== fw.n) { oneofs[f.oneof] = fw.n; parts[f.oneof] = []; }
          parts[f.oneof].push(fw.v);
        } else {
          (parts[fw.n] = parts[fw.n] || []).push(fw.v);
        }
      } else if (f.rep && f.type === 'double' && fw.wt === 2) {
        if (fw.v.length % 8 !== 0) throw new Error(name + ': packed doubles of ' + fw.v.length + ' bytes');
        for (var j = 0; j < fw.v.length; j += 8) msg[f.name].push(fw.v.subarray(j, j + 8));
      } else if (f.rep) {
        msg[f.name].push(scalar(f.type, fw.wt, fw.v, name));
      } else {
        msg[f.name] = scalar(f.type, fw.wt, fw.v, name);
      }
    }
    for (n in schema) {
      var fs = schema[n];
      if (typeof fs.type !== 'object' || fs.rep) continue;
      var got = fs.oneof ? (oneofs[fs.oneof] === Number(n) ? parts[fs.oneof] : null) : parts[n];
      if (got) msg[fs.name] = decode(concat(got), fs.type, path + '.' + fs.name);
    }
    for (var o in oneofs) {
      msg[o] = schema[oneofs[o]].name;
    }
    return msg;
  }
  function text(s) { return s.text; }
  function strBytes(s) { return s.bytes; }

  // ---------------------------------------------------------------- digests (RECORDS.md)
  function u64be(n) {
    var out = new Uint8Array(8), x = BigInt(n);
    for (var i = 7; i >= 0; i--) { out[i] = Number(x & 255n); x >>= 8n; }
    return out;
  }
  /** value(b) = 8-byte big-endian length, then b; field(name, c) = value(name) value(c). */
  function Digest(domain) { this.h = new Sha256(); this.value(utf8(domain)); }
  Digest.prototype.value = function (b) { this.h.update(u64be(b.length)); this.h.update(b); };
  Digest.prototype.bytes = function (name, b) { this.value(utf8(name)); this.value(b); return this; };
  Digest.prototype.str = function (name, s) { return this.bytes(name, typeof s === 'string' ? utf8(s) : s.bytes); };
  Digest.prototype.int = function (name, v) { return this.bytes(name, utf8(BigInt(v).toString())); };
  Digest.prototype.flag = function (name, v) { return this.bytes(name, utf8(v ? 'true' : 'false')); };
  /** Doubles, each given as its 8 wire bytes (little-endian), written big-endian: every bit
   *  kept, NaN payloads included (a JavaScript number would not keep them). */
  Digest.prototype.doubles = function (name, vs) {
    var out = new Uint8Array(8 * vs.length);
    for (var i = 0; i < vs.length; i++) for (var k = 0; k < 8; k++) out[8 * i + k] = vs[i][7 - k];
    return this.bytes(name, out);
  };
  Digest.prototype.finish = function () { return toHex(this.h.digest()); };

  function digestFiles(e, files) {
    e.int('files', files.length);
    files.forEach(function (f) { e.str('file_path', f.path).str('file_content', f.content); });
  }
  /** The request digest of a decoded RunRequest. */
  function requestDigest(r) {
    var v2 = r.protocol >= 2n;
    var e = new Digest(v2 ? 'plimsoll.run-request.v2' : 'plimsoll.run-request.v1');
    e.int('protocol', r.protocol).str('minimum_isolation', r.minimum_isolation).int('timeout_ms', r.timeout_ms);
    if (v2) {
      var rule = r.software_rule || { mode: { text: '', bytes: new Uint8Array(0) }, identities: [] };
      e.str('software_mode', rule.mode).int('software_identities', rule.identities.length);
      rule.identities.forEach(function (id) { e.str('software_identity', id); });
    }
    e.str('kind', r.payload || '');
    var p = r.payload ? r[r.payload] : null;
    if (r.payload === 'javascript') {
      e.str('code', p.code).str('grant_profile', p.grant_profile);
    } else if (r.payload === 'project') {
      e.str('grant_profile', p.grant_profile);
      digestFiles(e, p.files);
      e.int('steps', p.steps.length);
      p.steps.forEach(function (s) { e.str('step_command', s); });
      e.int('artifacts', p.artifacts.length);
      p.artifacts.forEach(function (a) { e.str('artifact_path', a); });
    } else if (r.payload === 'module') {
      e.str('model', p.model).doubles('end_time', [p.end_time]).doubles('step', [p.step]);
      e.int('rows', p.rows.length);
      p.rows.forEach(function (row) { e.doubles('row_values', row.values); });
    } else if (r.payload === 'cell') {
      e.str('language', p.language).str('code', p.code);
      digestFiles(e, p.files);
    }
    return e.finish();
  }
  /** The result digest of a decoded RunResponse. */
  function resultDigest(r) {
    var e = new Digest('plimsoll.run-result.v1');
    var k = r.result || '', x = r.result ? r[r.result] : null;
    e.str('kind', k);
    if (k === 'javascript') {
      e.int('exit_code', x.exit_code).flag('timed_out', x.timed_out).bytes('stdout', x.stdout).bytes('stderr', x.stderr)
        .flag('stdout_truncated', x.stdout_truncated).flag('stderr_truncated', x.stderr_truncated);
    } else if (k === 'project') {
      e.int('outcome', x.outcome).str('outcome_detail', x.outcome_detail).flag('artifacts_truncated', x.artifacts_truncated)
        .int('steps', x.steps.length);
      x.steps.forEach(function (s) {
        e.str('step_command', s.command).int('step_exit_code', s.exit_code).flag('step_timed_out', s.timed_out)
          .bytes('step_stdout', s.stdout).bytes('step_stderr', s.stderr)
          .flag('step_stdout_truncated', s.stdout_truncated).flag('step_stderr_truncated', s.stderr_truncated);
      });
      e.int('artifacts', x.artifacts.length);
      x.artifacts.forEach(function (a) { e.str('artifact_path', a.path).bytes('artifact_content', a.content); });
    } else if (k === 'module') {
      e.int('outcome', x.outcome).str('outcome_detail', x.outcome_detail).int('width', x.width)
        .bytes('stdout', x.stdout).bytes('stderr', x.stderr).int('runs', x.runs.length);
      x.runs.forEach(function (row) { e.int('run_status', row.status).doubles('run_outputs', row.outputs); });
    } else if (k === 'cell') {
      e.int('exit_code', x.exit_code).flag('timed_out', x.timed_out).bytes('stdout', x.stdout).bytes('stderr', x.stderr)
        .flag('stdout_truncated', x.stdout_truncated).flag('stderr_truncated', x.stderr_truncated)
        .flag('interpreter_started', x.interpreter_started).flag('interpreter_ended', x.interpreter_ended);
    }
    return e.finish();
  }
  /** The record digest of a record (strings as plain text or {text, bytes}; ints as BigInt). */
  function recordDigest(r) {
    var e = new Digest('plimsoll.run-record.v' + BigInt(r.version).toString());
    e.str('request_sha256', r.request_sha256).str('result_sha256', r.result_sha256);
    if (BigInt(r.version) >= 3n) e.str('unanswered', r.unanswered);
    e.str('provider', r.provider).str('isolation', r.isolation).str('environment', r.environment).str('policy', r.policy);
    if (BigInt(r.version) >= 2n) e.str('software_identity', r.software_identity).str('software_rule_id', r.software_rule_id);
    e.int('started_unix_ms', r.started_unix_ms).int('ended_unix_ms', r.ended_unix_ms).str('session', r.session)
      .int('sequence', r.sequence).str('previous_sha256', r.previous_sha256);
    return e.finish();
  }
  function compareBytes(a, b) {
    for (var i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
    return a.length - b.length;
  }
  /** `""`, `exact:<id>`, or `approved:sha256:` + SHA-256 of the sorted identities joined by 0x00. */
  function softwareRuleId(rule) {
    if (!rule || (rule.mode.bytes.length === 0 && rule.identities.length === 0)) return '';
    if (rule.identities.length === 1) return 'exact:' + rule.identities[0].text;
    var ids = rule.identities.map(strBytes).sort(compareBytes);
    var parts = [];
    ids.forEach(function (id, i) { if (i > 0) parts.push(new Uint8Array([0])); parts.push(id); });
    return 'approved:sha256:' + sha256Hex(concat(parts));
  }

  // ---------------------------------------------------------------- JSON: strict, exact integers
  /** Parses JSON text; objects become Maps (order kept, duplicates refused), integers BigInt. */
  function parseJson(s, what) {
    var i = 0;
    function fail(m) { throw new Error(what + ' is not valid JSON: ' + m + ' at character ' + i); }
    function ws() { while (i < s.length && ' \t\r\n'.indexOf(s[i]) >= 0) i++; }
    function val() {
      ws();
      var c = s[i];
      if (c === '{') {
        i++; var m = new Map(); ws();
        if (s[i] === '}') { i++; return m; }
        for (;;) {
          ws(); if (s[i] !== '"') fail('expected a member name');
          var k = str();
          if (m.has(k)) fail('duplicate member ' + JSON.stringify(k));
          ws(); if (s[i] !== ':') fail('expected :'); i++;
          m.set(k, val()); ws();
          if (s[i] === ',') { i++; continue; }
          if (s[i] === '}') { i++; return m; }
          fail('expected , or }');
        }
      }
      if (c === '[') {
        i++; var a = []; ws();
        if (s[i] === ']') { i++; return a; }
        for (;;) {
          a.push(val()); ws();
          if (s[i] === ',') { i++; continue; }
          if (s[i] === ']') { i++; return a; }
          fail('expected , or ]');
        }
      }
      if (c === '"') return str();
      if (s.startsWith('true', i)) { i += 4; return true; }
      if (s.startsWith('false', i)) { i += 5; return false; }
      if (s.startsWith('null', i)) { i += 4; return null; }
      var num = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(s.slice(i, i + 400));
      if (!num) fail('unexpected character');
      i += num[0].length;
      return (num[2] || num[3]) ? Number(num[0]) : BigInt(num[0]);
    }
    function str() {
      i++; var out = '';
      for (;;) {
        if (i >= s.length) fail('unterminated string');
        var c = s[i++];
        if (c === '"') return out;
        if (c < ' ') fail('a control character in a string');
        if (c !== '\\') { out += c; continue; }
        var e = s[i++];
        var simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
        if (simple[e] !== undefined) { out += simple[e]; continue; }
        if (e !== 'u' || !/^[0-9a-fA-F]{4}$/.test(s.slice(i, i + 4))) fail('a bad escape');
        out += String.fromCharCode(parseInt(s.slice(i, i + 4), 16)); i += 4;
      }
    }
    var v = val(); ws();
    if (i !== s.length) fail('trailing characters');
    return v;
  }
  /** A string as Go's encoding/json writes it (HTML-safe, \b and \f short, Go 1.22+). */
  function goString(s) {
    var out = '"';
    for (var k = 0; k < s.length; k++) {
      var c = s[k], code = s.charCodeAt(k);
      if (c === '"') out += '\\"';
      else if (c === '\\') out += '\\\\';
      else if (c === '\n') out += '\\n';
      else if (c === '\r') out += '\\r';
      else if (c === '\t') out += '\\t';
      else if (c === '\b') out += '\\b';
      else if (c === '\f') out += '\\f';
      else if (c === '<') out += '\\u003c';
      else if (c === '>') out += '\\u003e';
      else if (c === '&') out += '\\u0026';
      else if (code === 0x2028) out += '\\u2028';
      else if (code === 0x2029) out += '\\u2029';
      else if (code < 0x20) out += '\\u00' + (code < 16 ? '0' : '') + code.toString(16);
      else out += c;
    }
    return out + '"';
  }
  function members(m, what, required, optional) {
    if (!(m instanceof Map)) throw new Error(what + ' is not a JSON object');
    m.forEach(function (_, k) {
      if (required.indexOf(k) < 0 && (optional || []).indexOf(k) < 0) throw new Error(what + ' has an unknown member ' + JSON.stringify(k));
    });
    required.forEach(function (k) { if (!m.has(k)) throw new Error(what + ' lacks ' + JSON.stringify(k)); });
  }
  function wantString(v, what) { if (typeof v !== 'string') throw new Error(what + ' is not a string'); return v; }
  function wantInt(v, what, bits, signed) {
    if (typeof v !== 'bigint') throw new Error(what + ' is not an integer');
    var lo = signed ? -(1n << BigInt(bits - 1)) : 0n, hi = signed ? (1n << BigInt(bits - 1)) - 1n : (1n << BigInt(bits)) - 1n;
    if (v < lo || v > hi) throw new Error(what + ' is out of range');
    return v;
  }

  // ---------------------------------------------------------------- DSSE envelopes and statements
  var PAYLOAD_TYPE = 'application/vnd.in-toto+json';
  var STATEMENT_TYPE = 'https://in-toto.io/Statement/v1';
  var PREFIX = 'https://plimsollmark.github.io/plimsoll/';
  var PREDICATES = {};
  PREDICATES[PREFIX + 'run-record/v1'] = 'run-record';
  PREDICATES[PREFIX + 'session-close/v1'] = 'session';
  PREDICATES[PREFIX + 'bundle-link/v1'] = 'bundle-line';

  function envelopeFromJson(m, what) {
    members(m, what, ['payloadType', 'payload', 'signatures']);
    var sigs = m.get('signatures');
    if (!Array.isArray(sigs)) throw new Error(what + ' signatures is not a list');
    return {
      payloadType: wantString(m.get('payloadType'), what + ' payloadType'),
      payload: fromBase64(wantString(m.get('payload'), what + ' payload'), what + ' payload'),
      signatures: sigs.map(function (s) {
        members(s, what + ' signature', ['keyid', 'sig']);
        return { keyid: wantString(s.get('keyid'), what + ' keyid'), sig: fromBase64(wantString(s.get('sig'), what + ' sig'), what + ' signature') };
      })
    };
  }
  function envelopeJson(env) {
    return '{"payloadType":' + goString(env.payloadType) + ',"payload":"' + toBase64(env.payload) + '","signatures":[' +
      env.signatures.map(function (s) { return '{"keyid":' + goString(s.keyid) + ',"sig":"' + toBase64(s.sig) + '"}'; }).join(',') + ']}';
  }
  function pae(type, payload) {
    var t = utf8(type);
    return concat([utf8('DSSEv1 ' + t.length + ' '), t, utf8(' ' + payload.length + ' '), payload]);
  }
  /** Decodes an in-toto statement of one of the three kinds, refusing anything unexpected. */
  function decodeStatement(payload) {
    var st = parseJson(fromUtf8(payload, 'the statement'), 'the statement');
    members(st, 'the statement', ['_type', 'subject', 'predicateType', 'predicate']);
    if (st.get('_type') !== STATEMENT_TYPE) throw new Error('_type is ' + JSON.stringify(st.get('_type')));
    var subjects = st.get('subject');
    if (!Array.isArray(subjects) || subjects.length !== 1) throw new Error('a statement must have exactly one subject');
    members(subjects[0], 'the subject', ['name', 'digest']);
    var dg = subjects[0].get('digest');
    members(dg, 'the subject digest', ['sha256']);
    var digest = wantString(dg.get('sha256'), 'the subject digest');
    var ptype = wantString(st.get('predicateType'), 'predicateType');
    var name = PREDICATES[ptype];
    if (!name) throw new Error('unknown predicateType ' + JSON.stringify(ptype));
    if (subjects[0].get('name') !== name) throw new Error('subject name is ' + JSON.stringify(subjects[0].get('name')) + ', expected ' + JSON.stringify(name));
    var p = st.get('predicate');
    if (name === 'run-record') {
      var strs = ['request_sha256', 'result_sha256', 'provider', 'isolation', 'environment', 'policy', 'session', 'previous_sha256', 'record_sha256'];
      var opt = ['software_identity', 'software_rule_id', 'unanswered'];
      members(p, 'the record', ['version', 'started_unix_ms', 'ended_unix_ms', 'sequence'].concat(strs), opt);
      var rec = {
        version: wantInt(p.get('version'), 'version', 32, false),
        started_unix_ms: wantInt(p.get('started_unix_ms'), 'started_unix_ms', 64, true),
        ended_unix_ms: wantInt(p.get('ended_unix_ms'), 'ended_unix_ms', 64, true),
        sequence: wantInt(p.get('sequence'), 'sequence', 64, false)
      };
      strs.concat(opt).forEach(function (k) { rec[k] = p.has(k) ? wantString(p.get(k), k) : ''; });
      return { kind: 'record', record: rec, subject: digest };
    }
    if (name === 'session') {
      members(p, 'the close', ['session', 'calls', 'last_record_sha256']);
      return { kind: 'close', session: wantString(p.get('session'), 'session'), calls: wantInt(p.get('calls'), 'calls', 64, false),
        last: wantString(p.get('last_record_sha256'), 'last_record_sha256'), subject: digest };
    }
    members(p, 'the link', ['index', 'previous_sha256'], ['entry_sha256', 'checkpoint', 'lines']);
    var link = { index: wantInt(p.get('index'), 'index', 64, false), previous: wantString(p.get('previous_sha256'), 'previous_sha256'),
      entry: p.has('entry_sha256') ? wantString(p.get('entry_sha256'), 'entry_sha256') : '',
      checkpoint: p.has('checkpoint') ? p.get('checkpoint') : false,
      lines: p.has('lines') ? wantInt(p.get('lines'), 'lines', 64, false) : 0n };
    if (typeof link.checkpoint !== 'boolean') throw new Error('checkpoint is not a boolean');
    return { kind: 'link', link: link, subject: digest };
  }

  // ---------------------------------------------------------------- the bundle
  var TIERS = ['process', 'container', 'kernel', 'vm'];
  var CODES = ['canceled', 'unknown', 'invalid_argument', 'deadline_exceeded', 'not_found', 'already_exists',
    'permission_denied', 'resource_exhausted', 'failed_precondition', 'aborted', 'out_of_range',
    'unimplemented', 'internal', 'unavailable', 'data_loss', 'unauthenticated'];
  var RECORD_FIELDS = ['version', 'request_sha256', 'result_sha256', 'provider', 'isolation', 'environment', 'policy',
    'started_unix_ms', 'ended_unix_ms', 'session', 'sequence', 'previous_sha256', 'record_sha256',
    'software_identity', 'software_rule_id', 'unanswered'];
  function plain(v) { return (v && typeof v === 'object' && 'text' in v) ? v.text : v; }

  /**
   * One line's checks, in the order a reader would ask: what the line holds, whether its
   * digests recompute from the stored bytes, whether the signature verifies, whether the
   * link chains it to the line before. Every check runs (a later one is marked skipped when
   * what it needs could not be read); the verdict's reason is the first that failed.
   */
  function Checks() { this.list = []; }
  Checks.prototype.add = function (id, label, fn) {
    var c = { id: id, label: label, ok: true, detail: '' };
    try {
      var r = fn();
      if (r === undefined || r === true) c.detail = '';
      else if (typeof r === 'string') c.detail = r;
      else if (r && r.then) { c.pending = r; }
    } catch (e) { c.ok = false; c.detail = e.message; }
    this.list.push(c);
    return c;
  };
  Checks.prototype.skip = function (id, label, why) { this.list.push({ id: id, label: label, ok: false, skipped: true, detail: why }); };

  function expectSame(what, computed, stored) {
    if (computed !== stored) throw new Error(what + ' does not recompute: the stored bytes give ' + computed + ', the record says ' + (stored || '(empty)'));
    return computed;
  }

  /**
   * Verifies a bundle. `lines` are the bundle's lines as text (no newline), `pubPem` the
   * harness's public key, `ed25519` an async (raw key, message, signature) => boolean.
   * Resolves to {ok, reason, keyId, lines: [{n, kind, ok, reason, checks, view}]}.
   */
  async function verifyBundle(lines, pubPem, ed25519) {
    var key = parsePublicKey(pubPem);
    var report = { keyId: key.id, lines: [], ok: true, reason: '' };
    var previous = '';
    var sessions = new Map();
    var lastWasCheckpoint = false;

    async function verifySig(env, what) {
      if (env.payloadType !== PAYLOAD_TYPE) throw new Error(what + ' payloadType is ' + JSON.stringify(env.payloadType));
      var msg = pae(env.payloadType, env.payload);
      for (var i = 0; i < env.signatures.length; i++) {
        var s = env.signatures[i];
        if ((s.keyid === '' || s.keyid === key.id) && await ed25519(key.raw, msg, s.sig)) return;
      }
      throw new Error(what + ' does not verify with key ' + key.id.slice(0, 16) + '… (' + env.signatures.length + ' signature(s))');
    }

    for (var idx = 0; idx < lines.length; idx++) {
      var n = idx + 1, lineText = lines[idx];
      var lineBytes = utf8(lineText);
      var lineSha = sha256Hex(lineBytes);
      var out = { n: n, kind: 'line', checks: [], ok: true, reason: '', view: {} };
      var ck = new Checks();
      var entry = null, linkEnv = null, env = null;
      ck.add('line', 'the line is a bundle entry in its canonical form', function () {
        var m = parseJson(lineText, 'the line');
        members(m, 'the line', [], ['request', 'response', 'envelope', 'link']);
        if (!m.has('link')) throw new Error('the line has no link');
        entry = {
          request: m.has('request') ? fromBase64(wantString(m.get('request'), 'request'), 'request') : null,
          response: m.has('response') ? fromBase64(wantString(m.get('response'), 'response'), 'response') : null
        };
        env = m.has('envelope') ? envelopeFromJson(m.get('envelope'), 'the envelope') : null;
        linkEnv = envelopeFromJson(m.get('link'), 'the link');
        var parts = [];
        if (entry.request && entry.request.length) parts.push('"request":"' + toBase64(entry.request) + '"');
        if (entry.response && entry.response.length) parts.push('"response":"' + toBase64(entry.response) + '"');
        if (env) parts.push('"envelope":' + envelopeJson(env));
        entry.content = '{' + parts.join(',') + '}';
        var canonical = entry.content.slice(0, -1) + (parts.length ? ',' : '') + '"link":' + envelopeJson(linkEnv) + '}';
        if (canonical !== lineText) {
          var at = 0;
          while (at < canonical.length && canonical[at] === lineText[at]) at++;
          throw new Error('the line is not the canonical encoding of its entry (differs at character ' + at + ')');
        }
      });
      // What the line holds first (its digests and its signature), then how it is linked:
      // a changed answer is reported as a digest that does not recompute, not as a link.
      if (entry && env) {
        await entryChecks(ck, out, n, entry, env);
      } else if (entry && (entry.request || entry.response)) {
        ck.add('statement', 'the entry holds a signed statement', function () { throw new Error('an entry without an envelope'); });
      }
      var link = null;
      if (linkEnv) {
        var linkSig = ck.add('link-signature', 'the link\'s signature verifies', function () { return verifySig(linkEnv, 'the link\'s signature'); });
        if (linkSig.pending) { try { await linkSig.pending; } catch (e) { linkSig.ok = false; linkSig.detail = e.message; } delete linkSig.pending; }
        ck.add('link', n === 1 ? 'the link marks this as the first line and signs its content' : 'the link chains this line to line ' + (n - 1) + ' and signs its content', function () {
          if (linkEnv.signatures.length !== 1) throw new Error('the link carries ' + linkEnv.signatures.length + ' signatures, expected exactly one');
          var st = decodeStatement(linkEnv.payload);
          if (st.kind !== 'link') throw new Error('the link holds no bundle-link statement');
          link = st.link;
          if (link.index !== BigInt(n)) throw new Error('the link\'s index is ' + link.index + ', this is line ' + n);
          if (link.previous !== previous) {
            throw new Error(n === 1 ? 'the first line\'s link names a previous line' : 'the link names a line ' + (n - 1) + ' that is not the one stored (line ' + (n - 1) + ' changed after it was linked)');
          }
          var subject = link.checkpoint ? link.previous : link.entry;
          if (st.subject !== subject) throw new Error('the link\'s subject digest is not what it links');
          if (link.checkpoint) {
            if (entry.request || entry.response || env) throw new Error('a checkpoint line carries an entry');
            if (link.entry) throw new Error('a checkpoint link carries entry_sha256');
            if (link.lines !== BigInt(n - 1)) throw new Error('the checkpoint counts ' + link.lines + ' lines before it, there are ' + (n - 1));
          } else {
            if (link.lines !== 0n) throw new Error('a link that is no checkpoint carries lines');
            if (!env) throw new Error('an entry without an envelope');
            var own = sha256Hex(utf8(entry.content));
            if (link.entry !== own) throw new Error('the line\'s content is not what its link signed (content SHA-256 ' + own.slice(0, 16) + '…, the link names ' + link.entry.slice(0, 16) + '…)');
          }
        });
      } else {
        ck.skip('link', 'the link chains this line to the one before', 'the line could not be read');
      }
      var isCheckpoint = link && link.checkpoint;
      if (isCheckpoint) {
        out.kind = 'checkpoint';
        out.view = { lines: Number(link.lines) };
      }
      out.checks = ck.list;
      var bad = ck.list.filter(function (c) { return !c.ok; });
      out.ok = bad.length === 0;
      out.reason = bad.length ? bad[0].detail : '';
      report.lines.push(out);
      previous = lineSha;
      lastWasCheckpoint = !!isCheckpoint;
    }

    async function entryChecks(ck, out, n, entry, env) {
      var st = null, req = null, resp = null, rec = null;
      // The signed statement first: the record it carries is what everything else is held to.
      var sig = ck.add('signature', 'the record\'s Ed25519 signature verifies', function () { return verifySig(env, 'the record\'s signature'); });
      if (sig.pending) { try { await sig.pending; } catch (e) { sig.ok = false; sig.detail = e.message; } delete sig.pending; }
      ck.add('statement', 'the signed statement is a well-formed in-toto statement', function () {
        st = decodeStatement(env.payload);
        if (st.kind === 'link') throw new Error('the envelope holds a bundle-link statement');
      });
      if (st && st.kind === 'close') {
        out.kind = 'close';
        out.view = { session: st.session, calls: Number(st.calls) };
        ck.add('close', 'the session close counts the calls the bundle holds', function () {
          if (entry.request || entry.response) throw new Error('a session close carries an exchange');
          var s = sessions.get(st.session) || { calls: 0n, last: '', first: n };
          if (s.closed) throw new Error('a second close of this session (closed at line ' + s.closed + ')');
          if (st.calls !== s.calls || st.last !== s.last) throw new Error('the close counts ' + st.calls + ' calls, the bundle holds ' + s.calls);
          s.closed = n;
          sessions.set(st.session, s);
        });
        return;
      }
      if (!st) return;
      rec = st.record;
      out.kind = rec.session ? 'call' : 'run';
      ck.add('record', 'the record digest recomputes from the record\'s fields', function () {
        if (rec.version === 1n) throw new Error('a version 1 record (bundles hold versions 2 and 3 only)');
        if (rec.version !== 2n && rec.version !== 3n) throw new Error('record version ' + rec.version + ' is not 2 or 3');
        if (rec.version === 2n && rec.unanswered) throw new Error('a version 2 record carries unanswered');
        if (rec.version === 3n && !rec.unanswered) throw new Error('a version 3 record without unanswered');
        expectSame('the record digest', recordDigest(rec), rec.record_sha256);
        if (st.subject !== rec.record_sha256) throw new Error('the statement\'s subject is not the record digest');
      });
      ck.add('request', 'the request digest recomputes from the stored request bytes', function () {
        if (!entry.request) throw new Error('a record without its request');
        req = decode(entry.request, S.RunRequest, 'request');
        return expectSame('the request digest', requestDigest(req), rec.request_sha256);
      });
      var unanswered = rec.version === 3n;
      ck.add('result', unanswered ? 'the call has no answer, as its record says' : 'the result digest recomputes from the stored answer bytes', function () {
        if (unanswered) {
          if (entry.response) throw new Error('an unanswered (version 3) record with a response');
          if (rec.result_sha256) throw new Error('an unanswered record carries a result digest');
          if (CODES.indexOf(rec.unanswered) < 0) throw new Error(JSON.stringify(rec.unanswered) + ' is not a gRPC code name');
          return;
        }
        if (!entry.response) throw new Error('an answered (version 2) record without its response');
        resp = decode(entry.response, S.RunResponse, 'response');
        return expectSame('the result digest', resultDigest(resp), rec.result_sha256);
      });
      ck.add('agree', 'the answer, the request and the signed record agree (provider, tier, floor, chain)', function () {
        if (!req) throw new Error('the request could not be read');
        if (resp) {
          if (!resp.record) throw new Error('the stored answer carries no record');
          for (var i = 0; i < RECORD_FIELDS.length; i++) {
            var f = RECORD_FIELDS[i];
            if (String(plain(resp.record[f])) !== String(rec[f])) throw new Error('the stored answer\'s record differs from the signed record in ' + f);
          }
          [['provider', 'sandbox'], ['isolation', 'isolation'], ['environment', 'environment'], ['software_identity', 'software_identity']]
            .forEach(function (p) {
              if (plain(resp[p[1]]) !== rec[p[0]]) throw new Error('the answer says ' + p[0] + ' ' + JSON.stringify(plain(resp[p[1]])) + ', the record ' + JSON.stringify(rec[p[0]]));
            });
        } else if (!unanswered) {
          throw new Error('the answer could not be read');
        }
        var rule = softwareRuleId(req.software_rule);
        if (rule !== rec.software_rule_id) throw new Error('software_rule_id is ' + JSON.stringify(rec.software_rule_id) + ', the request gives ' + JSON.stringify(rule));
        var sr = req.software_rule;
        if (sr && sr.mode.bytes.length > 0) {
          var allowed = sr.identities.map(function (id) { return id.text; });
          if (!rec.software_identity || allowed.indexOf(rec.software_identity) < 0) throw new Error('the software identity ' + JSON.stringify(rec.software_identity) + ' is not in the request\'s rule (' + sr.mode.text + ' of ' + JSON.stringify(allowed) + ')');
        }
        var floor = req.minimum_isolation.text, tier = TIERS.indexOf(rec.isolation);
        if (tier < 0 || tier < Math.max(0, TIERS.indexOf(floor))) throw new Error('the tier ' + JSON.stringify(rec.isolation) + ' does not meet the floor ' + JSON.stringify(floor));
        if (!rec.session) {
          if (unanswered) throw new Error('an unanswered record outside a session');
          if (rec.sequence !== 0n || rec.previous_sha256) throw new Error('a single run carries session fields');
          return;
        }
        var s = sessions.get(rec.session) || { calls: 0n, last: '', first: n };
        if (s.closed) throw new Error('a call of its session after the close at line ' + s.closed);
        if (rec.sequence !== s.calls + 1n) throw new Error('sequence is ' + rec.sequence + ', expected ' + (s.calls + 1n));
        if (rec.previous_sha256 !== s.last) throw new Error('previous_sha256 is not the session\'s previous record');
        s.calls += 1n; s.last = rec.record_sha256;
        sessions.set(rec.session, s);
      });
      out.view = {
        record_sha256: rec.record_sha256, request_sha256: rec.request_sha256, result_sha256: rec.result_sha256,
        provider: rec.provider, isolation: rec.isolation, started_unix_ms: Number(rec.started_unix_ms),
        duration_ms: Number(rec.ended_unix_ms - rec.started_unix_ms), version: Number(rec.version)
      };
      if (req && req.payload) {
        var p = req[req.payload];
        out.view.kind = req.payload;
        out.view.floor = req.minimum_isolation.text;
        out.view.code = p.code ? p.code.text : (p.steps || []).map(text).join('\n');
      }
      if (resp && resp.result) {
        var r = resp[resp.result];
        var steps = r.steps || [];
        var code = r.exit_code !== undefined ? r.exit_code : steps.length ? steps[steps.length - 1].exit_code : null;
        out.view.exit_code = code === null ? null : Number(code);
        var stdout = r.stdout || concat(steps.map(function (st) { return st.stdout; }));
        try { out.view.stdout = fromUtf8(stdout, 'stdout'); } catch (e) { out.view.stdout = '(' + stdout.length + ' bytes, not UTF-8)'; }
      }
    }

    if (lines.length === 0) { report.ok = false; report.reason = 'the bundle is empty'; }
    else if (!lastWasCheckpoint) { report.ok = false; report.reason = 'the bundle does not end in a checkpoint (line ' + lines.length + ')'; }
    var open = [];
    sessions.forEach(function (s, fp) { if (!s.closed) open.push([s.first, fp]); });
    var firstBad = report.lines.filter(function (l) { return !l.ok; })[0];
    if (firstBad) { report.ok = false; report.reason = 'line ' + firstBad.n + ': ' + firstBad.reason; }
    else if (report.ok && open.length) {
      open.sort(function (a, b) { return a[0] - b[0]; });
      report.ok = false; report.reason = 'line ' + open[0][0] + ': session ' + open[0][1] + ' (first seen here) is never closed';
    }
    return report;
  }

  /** A verifier of Ed25519 signatures: WebCrypto where the platform has Ed25519, else pure JS. */
  async function pickEd25519(force) {
    var subtle = (typeof crypto !== 'undefined' && crypto.subtle) ? crypto.subtle : null;
    if (force !== 'js' && subtle) {
      try {
        var probe = await subtle.importKey('raw', BASE_ENCODED, { name: 'Ed25519' }, false, ['verify']);
        if (probe) {
          var cache = new Map();
          return {
            engine: 'webcrypto',
            verify: async function (raw, msg, sig) {
              var h = toHex(raw);
              if (!cache.has(h)) cache.set(h, await subtle.importKey('raw', raw, { name: 'Ed25519' }, false, ['verify']));
              return subtle.verify({ name: 'Ed25519' }, cache.get(h), sig, msg);
            }
          };
        }
      } catch (e) { /* no Ed25519 in this browser: the pure-JS verifier below */ }
    }
    return { engine: 'javascript', verify: async function (raw, msg, sig) { return ed25519VerifyJs(raw, msg, sig); } };
  }
  var BASE_ENCODED = encodePoint(BASE);

  var api = {
    sha256Hex: sha256Hex, sha512: sha512, toHex: toHex, fromBase64: fromBase64, toBase64: toBase64, utf8: utf8,
    ed25519VerifyJs: ed25519VerifyJs, parsePublicKey: parsePublicKey, schemas: S, decode: decode,
    requestDigest: requestDigest, resultDigest: resultDigest, recordDigest: recordDigest,
    softwareRuleId: softwareRuleId, parseJson: parseJson, goString: goString, decodeStatement: decodeStatement,
    verifyBundle: verifyBundle, pickEd25519: pickEd25519
  };
  if (typeof module === 'object' && module.exports) module.exports = api;
  else root.PlimsollCheck = api;
})(typeof self !== 'undefined' ? self : this);
