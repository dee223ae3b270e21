// The agent's code: what runs inside the sandbox (plimsolld's process provider).
// It knows neither the memory API's address nor its key; it finds the run's relay
// through the grant client (PLIMSOLL_GRANT_JS) and calls routes by path.
const fs = require('fs');
const path = require('path');
const grant = require(process.env.PLIMSOLL_GRANT_JS);

function report(step, method, p, r) {
  console.log(JSON.stringify({ step, method, path: p, status: r.status, refused: r.refused, body: r.body }));
}

// Every file the run can see in its working directory and the grant client's directory.
function walk(dir, out) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    try {
      if (e.isDirectory()) walk(p, out);
      else out[p] = fs.readFileSync(p, 'latin1');
    } catch (_) { /* unreadable: skip */ }
  }
  return out;
}

(async () => {
  // 1. Store a memory (granted: POST /v1/memories).
  const stored = await grant.post('/v1/memories', {
    key: 'user-preference',
    text: 'The user wants answers in metric units.',
  });
  report('store', 'POST', '/v1/memories', stored);
  const id = stored.body && stored.body.id;

  // 2. Recall it (granted: GET /v1/memories/{memoryId}).
  const recalled = await grant.get(`/v1/memories/${id}`);
  report('recall', 'GET', `/v1/memories/${id}`, recalled);

  // 3. Outside the grant: forget it (DELETE is in the API, not in the grant).
  report('forget', 'DELETE', `/v1/memories/${id}`, await grant.del(`/v1/memories/${id}`));

  // 4. Outside the grant: export every agent's memories.
  report('export', 'GET', '/v1/admin/export', await grant.get('/v1/admin/export'));

  // 5. What the sandbox can see: its environment and its files.
  const files = {};
  walk(process.cwd(), files);
  walk(path.dirname(process.env.PLIMSOLL_GRANT_JS), files);
  console.log(JSON.stringify({
    step: 'inventory',
    env_names: Object.keys(process.env).sort(),
    files: Object.keys(files).length,
    dump: JSON.stringify({ env: process.env, files }),
  }));
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exitCode = 3;
});
