// plimsoll_grant.js: the sandbox side of a plimsoll grant (CommonJS, Node 18+).
//
// It finds the run's relay from the environment (PLIMSOLL_GRANT_URL or
// PLIMSOLL_GRANT_SOCKET, and PLIMSOLL_GRANT_SECRET) and sends each call there. It never sees
// the API's credential or address: the broker, outside the sandbox, checks each call against
// the grant, attaches the credential and forwards it.
//
//   const grant = require(process.env.PLIMSOLL_GRANT_JS);
//   const r = await grant.post('/v1/memories', { key: 'k', text: 'hello' });
//   // r = { status, ok, refused, contentType, body }  (body parsed when it is JSON)
//
// A call the grant does not allow answers 403 with `refused: true` and a JSON reason.
'use strict';
const http = require('http');

function relay() {
  const url = process.env.PLIMSOLL_GRANT_URL;
  const socketPath = process.env.PLIMSOLL_GRANT_SOCKET;
  const secret = process.env.PLIMSOLL_GRANT_SECRET;
  if (!secret || (!url && !socketPath)) {
    throw new Error('this run has no grant: PLIMSOLL_GRANT_URL (or PLIMSOLL_GRANT_SOCKET) and PLIMSOLL_GRANT_SECRET are unset');
  }
  if (socketPath) return { socketPath, secret };
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port), secret };
}

function request(method, path, body, opts) {
  opts = opts || {};
  const r = relay();
  let payload = null;
  let contentType = opts.contentType;
  if (body !== undefined && body !== null) {
    if (typeof body === 'string' || Buffer.isBuffer(body)) {
      payload = Buffer.from(body);
      contentType = contentType || 'text/plain; charset=utf-8';
    } else {
      payload = Buffer.from(JSON.stringify(body));
      contentType = contentType || 'application/json';
    }
  }
  const headers = { 'x-plimsoll-grant-secret': r.secret, accept: opts.accept || 'application/json' };
  if (payload) {
    headers['content-type'] = contentType;
    headers['content-length'] = payload.length;
  }
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: r.host, port: r.port, socketPath: r.socketPath, method, path, headers, agent: false },
      (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          const raw = Buffer.concat(chunks);
          const ct = res.headers['content-type'] || '';
          let parsed = raw.toString('utf8');
          if (/json/i.test(ct) && raw.length) {
            try { parsed = JSON.parse(parsed); } catch (_) { /* keep the text */ }
          }
          resolve({
            status: res.statusCode,
            ok: res.statusCode >= 200 && res.statusCode < 300,
            refused: res.headers['x-plimsoll-broker'] === 'refused',
            contentType: ct,
            body: parsed,
          });
        });
      },
    );
    req.on('error', reject);
    if (payload) req.write(payload);
    req.end();
  });
}

module.exports = {
  request,
  get: (path, opts) => request('GET', path, undefined, opts),
  del: (path, opts) => request('DELETE', path, undefined, opts),
  post: (path, body, opts) => request('POST', path, body, opts),
  put: (path, body, opts) => request('PUT', path, body, opts),
  patch: (path, body, opts) => request('PATCH', path, body, opts),
};
