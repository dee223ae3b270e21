// plimsoll cell driver (javascript). Passed to `node -e`; never a file the cell can edit.
// fd 3 is the runner's control socket: one JSON line {"nonce", "code"} per cell in, one
// JSON line {"nonce", "status"} out when the cell is over. stdout/stderr are the cell's.
(() => {
  const net = require('net');
  const vm = require('vm');
  const util = require('util');
  const ctl = new net.Socket({ fd: 3, readable: true, writable: true });

  const isIdStart = (c) => /[A-Za-z_$\u0080-\uffff]/.test(c);
  const isId = (c) => /[\w$\u0080-\uffff]/.test(c);

  // Scans the code's top level (outside every bracket), skipping strings, templates,
  // comments and regular expressions. Returns the edits that make top-level declarations
  // persist (`asyncMode`: the code runs inside an async function) and the statement starts.
  function scan(src, asyncMode) {
    const edits = [];
    const starts = [];
    const stack = [];
    let prev = '';
    let nl = true;
    let i = 0;
    let bodyPending = false;
    let bodyDepthClose = false;
    const n = src.length;
    const skipTemplate = (j) => {
      while (j < n) {
        const c = src[j];
        if (c === '\\') { j += 2; continue; }
        if (c === '`') return [j + 1, false];
        if (c === '$' && src[j + 1] === '{') return [j + 2, true];
        j++;
      }
      return [n, false];
    };
    while (i < n) {
      const c = src[i];
      if (c === '\n') { nl = true; i++; continue; }
      if (/\s/.test(c)) { i++; continue; }
      if (c === '/' && src[i + 1] === '/') {
        const j = src.indexOf('\n', i);
        i = j < 0 ? n : j;
        continue;
      }
      if (c === '/' && src[i + 1] === '*') {
        const j = src.indexOf('*/', i + 2);
        const end = j < 0 ? n : j + 2;
        if (src.slice(i, end).includes('\n')) nl = true;
        i = end;
        continue;
      }
      const top = stack.length === 0;
      const atStmt = top && (prev === '' || prev === ';' || prev === '}' || (nl && prev !== 'op'));
      if (atStmt) starts.push(i);
      nl = false;
      if (c === '"' || c === "'") {
        let j = i + 1;
        while (j < n && src[j] !== c && src[j] !== '\n') j += src[j] === '\\' ? 2 : 1;
        i = j + 1;
        prev = 'val';
        continue;
      }
      if (c === '`') {
        const [j, open] = skipTemplate(i + 1);
        if (open) stack.push('${');
        i = j;
        prev = 'val';
        continue;
      }
      if (c === '/' && !(prev === 'id' || prev === 'val' || prev === ')')) {
        let j = i + 1;
        let cls = false;
        while (j < n && src[j] !== '\n') {
          if (src[j] === '\\') { j += 2; continue; }
          if (src[j] === '[') cls = true;
          else if (src[j] === ']') cls = false;
          else if (src[j] === '/' && !cls) break;
          j++;
        }
        j++;
        while (j < n && isId(src[j])) j++;
        i = j;
        prev = 'val';
        continue;
      }
      if (isIdStart(c)) {
        let j = i + 1;
        while (j < n && isId(src[j])) j++;
        const word = src.slice(i, j);
        if (atStmt) {
          const rest = src.slice(j);
          const decl = /^\s+([A-Za-z_$][\w$]*)\s*=(?!=)/.exec(rest);
          if ((word === 'let' || word === 'const' || word === 'var') && /^\s*[A-Za-z_$[{]/.test(rest)) {
            if (asyncMode && decl) edits.push([i, j - i, '']);
            else if (word !== 'var') edits.push([i, j - i, 'var']);
          } else if (word === 'class' || (asyncMode && word === 'function')) {
            const m = /^\s+([A-Za-z_$][\w$]*)/.exec(rest);
            if (m) {
              edits.push([i, 0, (asyncMode ? '' : 'var ') + m[1] + ' = ']);
              bodyPending = true;
            }
          }
        }
        i = j;
        prev = 'id';
        continue;
      }
      if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) {
        let j = i + 1;
        while (j < n && /[\w.]/.test(src[j])) j++;
        i = j;
        prev = 'val';
        continue;
      }
      if (c === '(' || c === '[' || c === '{') {
        if (c === '{' && top && bodyPending) {
          bodyPending = false;
          bodyDepthClose = true;
          stack.push('body');
        } else {
          stack.push(c);
        }
        prev = 'op';
        i++;
        continue;
      }
      if (c === ')' || c === ']' || c === '}') {
        const opened = stack.pop();
        if (opened === '${') {
          const [j, open] = skipTemplate(i + 1);
          if (open) stack.push('${');
          i = j;
          prev = 'val';
          continue;
        }
        if (opened === 'body' && bodyDepthClose && stack.length === 0) {
          bodyDepthClose = false;
          edits.push([i + 1, 0, ';']);
        }
        prev = c === '}' ? '}' : ')';
        i++;
        continue;
      }
      prev = c === ';' ? ';' : 'op';
      i++;
    }
    return { edits, starts };
  }

  function apply(src, edits) {
    let out = src;
    for (const [at, del, ins] of edits.sort((a, b) => b[0] - a[0])) {
      out = out.slice(0, at) + ins + out.slice(at + del);
    }
    return out;
  }

  const compiles = (code) => {
    try { new vm.Script(code); return true; } catch (e) { return false; }
  };

  // The code as the body of an async function that returns its last expression's value.
  function asyncBody(code) {
    const { starts } = scan(code, false);
    let chosen = -1;
    for (let k = starts.length - 1; k >= 0 && k >= starts.length - 50; k--) {
      const tail = code.slice(starts[k]).replace(/[\s;]*$/, '');
      if (tail && compiles('(async () => (\n' + tail + '\n))')) chosen = starts[k];
      else if (chosen >= 0) break;
    }
    if (chosen >= 0) {
      const tail = code.slice(chosen).replace(/[\s;]*$/, '');
      const body = code.slice(0, chosen) + 'return (\n' + tail + '\n);';
      if (compiles('(async () => {\n' + body + '\n})')) return body;
    }
    return code;
  }

  async function runCell(src) {
    let value;
    const sync = apply(src, scan(src, false).edits);
    let script = null;
    let syntax = null;
    try {
      script = new vm.Script(sync, { filename: 'cell.js' });
    } catch (e) {
      syntax = e;
    }
    if (script) {
      value = script.runInThisContext();
    } else if (/\bawait\b/.test(src)) {
      const body = asyncBody(apply(src, scan(src, true).edits));
      const fn = vm.runInThisContext('(async () => {\n' + body + '\n})', { filename: 'cell.js', lineOffset: -1 });
      value = await fn();
    } else {
      throw syntax;
    }
    if (value !== undefined) process.stdout.write(util.inspect(value) + '\n');
  }

  // The error's stack without the driver's own frames.
  const report = (e) => {
    const text = e && e.stack ? String(e.stack) : 'Uncaught ' + util.inspect(e);
    const lines = text.split('\n').filter((l) => !/^\s+at .*(\[eval\]|node:)/.test(l));
    process.stderr.write(lines.join('\n') + '\n');
  };
  process.on('uncaughtException', report);
  process.on('unhandledRejection', report);

  let buf = '';
  const queue = [];
  let busy = false;
  async function pump() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      let msg;
      try { msg = JSON.parse(queue.shift()); } catch (e) { process.exit(2); }
      let status = 'ok';
      try {
        await runCell(String(msg.code));
      } catch (e) {
        status = 'error';
        report(e);
      }
      ctl.write(JSON.stringify({ nonce: msg.nonce, status }) + '\n');
    }
    busy = false;
  }
  ctl.setEncoding('utf8');
  ctl.on('data', (d) => {
    buf += d;
    let at;
    while ((at = buf.indexOf('\n')) >= 0) {
      queue.push(buf.slice(0, at));
      buf = buf.slice(at + 1);
    }
    pump();
  });
  ctl.on('end', () => process.exit(0));
  ctl.on('error', () => process.exit(1));
})();
