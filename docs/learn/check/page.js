/*
 * The page around verify.js: shows each record of the bundle (check/bundle.js), runs the
 * checks, paints a verdict per record, and lets the reader change one byte and watch.
 *
 * What a test (or a curious reader) can read from the DOM:
 *   #summary[data-state]        "running", then "done" (or "error")
 *   #summary[data-ok]           "true" when every line checks
 *   #summary[data-verify-ms]    milliseconds the last full check took, as the page measured it
 *   #summary[data-engine]       "webcrypto" or "javascript" (the Ed25519 verifier used)
 *   .line[data-line][data-kind][data-verdict][data-reason]   one per bundle line
 * ?engine=js forces the pure-JavaScript Ed25519 verifier; ?press=answer:N (signature:N,
 * link:N) presses that button of line N after the first check.
 */
(function () {
  'use strict';
  var C = window.PlimsollCheck;
  var B = window.PLIMSOLL_BUNDLE;
  var original = B ? B.lines.slice() : [];
  var current = original.slice();
  var ed = null;
  var runs = 0;

  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === 'text') e.textContent = attrs[k];
      else if (k === 'class') e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    });
    (kids || []).forEach(function (k) { if (k) e.appendChild(k); });
    return e;
  }
  function short(h) { return h ? h.slice(0, 16) + '…' : '(empty)'; }

  // ------------------------------------------------------------ one byte, changed on purpose
  function lineJson(n) { return JSON.parse(current[n - 1]); }
  function flipIn(bytes, at) { var b = Uint8Array.from(bytes); b[at] ^= 0x01; return b; }
  /** The answer: the first byte of the program's stdout inside the stored RunResponse. */
  function tamperAnswer(n) {
    var o = lineJson(n);
    var resp = C.fromBase64(o.response, 'response');
    var d = C.decode(resp, C.schemas.RunResponse, 'response');
    var r = d.result ? d[d.result] : null;
    var out = r && (r.stdout && r.stdout.length ? r.stdout : (r.steps && r.steps[0] && r.steps[0].stdout));
    if (!out || !out.length) return note(n, 'this answer has no stdout to change');
    var at = out.byteOffset - resp.byteOffset;
    o.response = C.toBase64(flipIn(resp, at));
    replace(n, o, 'changed one byte of the stored answer: the first byte of its stdout, "' +
      String.fromCharCode(resp[at]) + '" became "' + String.fromCharCode(resp[at] ^ 1) + '"');
  }
  function tamperSignature(n) {
    var o = lineJson(n);
    var sig = C.fromBase64(o.envelope.signatures[0].sig, 'sig');
    o.envelope.signatures[0].sig = C.toBase64(flipIn(sig, 0));
    replace(n, o, 'changed one byte of the record\'s signature (the first of its 64)');
  }
  function tamperLink(n) {
    var o = lineJson(n);
    var p = C.fromBase64(o.link.payload, 'link');
    var text = new TextDecoder().decode(p);
    var at = text.indexOf('"index":') + 8;
    o.link.payload = C.toBase64(flipIn(p, at));
    replace(n, o, 'changed one byte of the signed link: its line number ' + text[at] + ' became ' + String.fromCharCode(p[at] ^ 1));
  }
  /** Re-serialises an edited line the way the bundle stores it (Go's encoding/json). */
  function replace(n, o, what) {
    var parts = [];
    ['request', 'response'].forEach(function (k) { if (o[k] !== undefined) parts.push('"' + k + '":' + C.goString(o[k])); });
    ['envelope', 'link'].forEach(function (k) {
      if (o[k] === undefined) return;
      var e = o[k];
      parts.push('"' + k + '":{"payloadType":' + C.goString(e.payloadType) + ',"payload":' + C.goString(e.payload) +
        ',"signatures":[' + e.signatures.map(function (s) { return '{"keyid":' + C.goString(s.keyid) + ',"sig":' + C.goString(s.sig) + '}'; }).join(',') + ']}');
    });
    current[n - 1] = '{' + parts.join(',') + '}';
    note(n, what);
    check();
  }
  var notes = {};
  function note(n, what) { notes[n] = what; }

  // ------------------------------------------------------------ drawing
  function describe(l) {
    var v = l.view;
    if (l.kind === 'checkpoint') return 'Checkpoint: a signed link that seals the ' + v.lines + (v.lines === 1 ? ' line' : ' lines') + ' before it';
    if (l.kind === 'close') return 'Session close: ' + v.calls + ' call(s)';
    var what = v.kind === 'cell' ? 'a cell' : v.kind === 'project' ? 'a project' : v.kind === 'javascript' ? 'a JavaScript snippet' : 'a run';
    return (l.kind === 'call' ? 'Session call: ' : 'Run: ') + what + ' on the ' + (v.provider || '?') + ' provider, tier ' + (v.isolation || '?');
  }
  function draw(report) {
    var list = document.getElementById('lines');
    list.textContent = '';
    var records = 0;
    report.lines.forEach(function (l) {
      var isRecord = l.kind === 'run' || l.kind === 'call';
      if (isRecord) records++;
      var card = el('section', {
        class: 'line ' + (l.ok ? 'good' : 'bad') + (isRecord ? ' record' : ' small'),
        'data-line': String(l.n), 'data-kind': l.kind, 'data-verdict': l.ok ? 'valid' : 'invalid', 'data-reason': l.reason
      });
      card.appendChild(el('h3', {}, [
        el('span', { class: 'verdict', text: l.ok ? '✓ checks' : '✗ does not check' }),
        el('span', { text: ' line ' + l.n + (isRecord ? ', record ' + records : '') + ' — ' + describe(l) })
      ]));
      if (!l.ok) card.appendChild(el('p', { class: 'reason', text: 'Why: ' + l.reason }));
      if (notes[l.n]) card.appendChild(el('p', { class: 'note', text: 'You ' + notes[l.n] + '.' }));
      if (isRecord && l.view.code !== undefined) {
        card.appendChild(el('div', { class: 'io' }, [
          el('div', {}, [el('b', { text: 'What ran' + (l.view.floor ? ' (floor ' + l.view.floor + ')' : '') }), el('pre', { text: l.view.code })]),
          el('div', {}, [el('b', { text: 'What came back (exit code ' + l.view.exit_code + ')' }), el('pre', { text: l.view.stdout || '(no stdout)' })])
        ]));
      }
      var ul = el('ul', { class: 'checks' });
      l.checks.forEach(function (c) {
        ul.appendChild(el('li', { class: c.ok ? 'ok' : 'no', 'data-check': c.id }, [
          el('span', { text: (c.ok ? '✓ ' : c.skipped ? '– ' : '✗ ') + c.label }),
          c.detail ? el('code', { text: c.ok ? ' ' + short(c.detail) : ' — ' + c.detail }) : null
        ]));
      });
      card.appendChild(ul);
      if (isRecord && l.view.record_sha256) {
        card.appendChild(el('p', { class: 'digest' }, [el('span', { text: 'record ' }), el('code', { text: l.view.record_sha256 })]));
      }
      var tools = el('div', { class: 'tools' });
      if (isRecord) {
        [['Change one byte of the answer', tamperAnswer], ['…of the signature', tamperSignature], ['…of the link', tamperLink]]
          .forEach(function (b) {
            var btn = el('button', { type: 'button', text: b[0] });
            btn.addEventListener('click', function () { b[1](l.n); });
            tools.appendChild(btn);
          });
      }
      if (current[l.n - 1] !== original[l.n - 1]) {
        var back = el('button', { type: 'button', text: 'Put it back' });
        back.addEventListener('click', function () { current[l.n - 1] = original[l.n - 1]; delete notes[l.n]; check(); });
        tools.appendChild(back);
      }
      var area = el('textarea', { spellcheck: 'false', 'aria-label': 'line ' + l.n + ' as stored' });
      area.value = current[l.n - 1];
      area.addEventListener('change', function () { current[l.n - 1] = area.value; note(l.n, 'edited the stored line by hand'); check(); });
      card.appendChild(el('details', {}, [el('summary', { text: 'The line as stored (edit it, then click outside the box)' }), area]));
      card.appendChild(tools);
      list.appendChild(card);
    });
  }

  function summarize(report, ms) {
    var s = document.getElementById('summary');
    var recs = report.lines.filter(function (l) { return l.kind === 'run' || l.kind === 'call'; });
    var good = recs.filter(function (l) { return l.ok; }).length;
    s.setAttribute('data-state', 'done');
    s.setAttribute('data-ok', String(report.ok));
    s.setAttribute('data-verify-ms', ms.toFixed(1));
    s.setAttribute('data-engine', ed.engine);
    s.setAttribute('data-records', String(recs.length));
    s.setAttribute('data-good', String(good));
    s.className = report.ok ? 'good' : 'bad';
    s.textContent = (report.ok ? '✓ ' : '✗ ') + good + ' of ' + recs.length + ' records check, and ' +
      (report.ok ? 'the bundle is whole' : 'the bundle does not: ' + report.reason) +
      '. Checked in ' + ms.toFixed(1) + ' ms in this browser (Ed25519 by ' +
      (ed.engine === 'webcrypto' ? 'WebCrypto' : 'the page\'s own JavaScript') + ').';
    document.getElementById('keyid').textContent = report.keyId;
  }

  async function check() {
    var run = ++runs;
    var t0 = performance.now();
    var report;
    try {
      report = await C.verifyBundle(current, B.pub, ed.verify);
    } catch (e) {
      var s = document.getElementById('summary');
      s.setAttribute('data-state', 'error');
      s.className = 'bad';
      s.textContent = '✗ ' + e.message;
      return;
    }
    var ms = performance.now() - t0;
    if (run !== runs) return;
    summarize(report, ms);
    draw(report);
    console.log('plimsoll-check ' + JSON.stringify({ ok: report.ok, ms: ms, engine: ed.engine,
      verdicts: report.lines.map(function (l) { return [l.n, l.kind, l.ok, l.reason]; }) }));
  }

  async function start() {
    var s = document.getElementById('summary');
    if (!C || !B) {
      s.setAttribute('data-state', 'error');
      s.textContent = '✗ check/verify.js or check/bundle.js did not load; keep them next to check.html.';
      return;
    }
    document.getElementById('pub').textContent = B.pub.trim();
    var force = /[?&]engine=js\b/.test(location.search) ? 'js' : '';
    ed = await C.pickEd25519(force);
    await check();
    // ?press=answer:1 (or signature:N, link:N) presses that button of line N once the page
    // has checked, as a reader would; the tests use it to drive the buttons.
    var press = /[?&]press=(answer|signature|link):(\d+)/.exec(location.search);
    if (press) {
      var n = Number(press[2]);
      ({ answer: tamperAnswer, signature: tamperSignature, link: tamperLink })[press[1]](n);
    }
  }
  start();
})();
