"""Drives plimsoll-mcp with the official MCP Python SDK (`mcp` on PyPI), an independent client.

    python mcp_sdk_client.py stdio BINARY ARG...   start BINARY ARG... and talk over stdio
    python mcp_sdk_client.py http URL TOKEN        talk streamable HTTP to URL with a bearer token

The server must have been given call files holding `config/greeting.txt` with the text
`hello from the embedder`. Every check raises on failure (exit 1, the reason on stderr);
each passed check prints one `ok <name>` line, and the last line is `all checks passed`.
"""

import asyncio
import json
import re
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

GREETING = "hello from the embedder"
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def ok(name):
    print(f"ok {name}", flush=True)


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def run(s, args, want_error=False):
    r = await s.call_tool("run_code", args)
    if bool(r.is_error) != want_error:
        raise AssertionError(f"run_code {args!r}: is_error={r.is_error}: {text(r)}")
    return r


async def scenario(s):
    init = await s.initialize()
    assert init.server_info.name == "plimsoll-mcp", init.server_info
    assert init.capabilities.tools is not None
    ok("initialize")

    tools = {t.name: t for t in (await s.list_tools()).tools}
    assert set(tools) == {"run_code", "open_session", "close_session", "describe"}, set(tools)
    rc = tools["run_code"].input_schema
    assert rc["required"] == ["language", "code"], rc
    assert rc["properties"]["language"]["enum"] == ["javascript", "python", "shell"], rc
    assert set(rc["properties"]) == {"language", "code", "files", "session", "timeout_ms", "minimum_isolation"}, rc
    assert rc["properties"]["minimum_isolation"]["enum"] == ["process", "container", "kernel", "vm"]
    assert rc.get("additionalProperties") is False
    out = tools["run_code"].output_schema
    assert out and "record_sha256" in out["required"] and "tier" in out["required"], out
    assert tools["close_session"].input_schema["required"] == ["session"]
    ok("tool schemas")

    r = await run(s, {"language": "javascript", "code": "console.log(6 * 7)"})
    sc = r.structured_content
    assert sc["stdout"] == "42\n" and sc["exit_code"] == 0 and sc["outcome"] == "completed", sc
    assert sc["tier"] == "process" and sc["provider"] == "process", sc
    assert HEX64.match(sc["record_sha256"]), sc
    assert "42" in text(r) and "tier process" in text(r), text(r)
    ok("javascript")

    r = await run(s, {"language": "python", "code": "import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)"})
    sc = r.structured_content
    assert sc["stdout"] == "45\n" and sc["stderr"] == "warn\n", sc
    ok("python")

    r = await run(s, {"language": "shell", "code": "echo shell-$((2+3)); exit 3"})
    sc = r.structured_content
    assert sc["stdout"] == "shell-5\n" and sc["exit_code"] == 3, sc
    assert text(r).startswith("exit code 3"), text(r)
    ok("shell, and a non-zero exit is a result, not a tool error")

    r = await run(s, {"language": "python", "code": "print(open('config/greeting.txt').read().strip())"})
    assert r.structured_content["stdout"] == GREETING + "\n", r.structured_content
    r = await run(s, {"language": "shell", "code": "cat config/greeting.txt data.txt",
                      "files": {"data.txt": "own file\n"}})
    assert r.structured_content["stdout"] == GREETING + "\nown file\n", r.structured_content
    ok("call files in fresh runs, before the call's own")

    r = await run(s, {"language": "python", "code": "1", "files": {"config/greeting.txt": "mine"}}, want_error=True)
    assert "config/greeting.txt" in text(r) and "call file" in text(r), text(r)
    ok("call file collision")

    r = await run(s, {"language": "python", "code": "print(1)", "minimum_isolation": "vm"}, want_error=True)
    assert text(r).startswith("not dispatched (isolation):"), text(r)
    ok("a floor above the tier is refused, not dispatched")

    r = await run(s, {"language": "python", "code": "while True: pass", "timeout_ms": 1500})
    sc = r.structured_content
    assert sc["timed_out"] is True and sc["outcome"] == "timed_out", sc
    assert text(r).startswith("timed out"), text(r)
    ok("timeout")

    for args, want in [
        ({"language": "python"}, "missing field `code`"),
        ({"language": "ruby", "code": "puts 1"}, "unknown variant `ruby`"),
        ({"language": "python", "code": "1", "files": {"big.txt": "x" * (5 * 1024 * 1024)}}, "at most 4194304"),
        ({"language": "python", "code": "1", "files": {"../escape": "x"}}, "../escape"),
        ({"language": "python", "code": "1", "timeout_ms": 0}, "1 to 300000"),
        ({"language": "python", "code": "1", "session": "s-" + "0" * 32}, "no open session"),
    ]:
        r = await run(s, args, want_error=True)
        assert want in text(r), (args if len(str(args)) < 200 else list(args), text(r))
    ok("malformed arguments are tool errors that say what to fix")

    try:
        await s.call_tool("rm_rf", {})
        raise AssertionError("an unknown tool was answered")
    except MCPError as e:
        assert "unknown tool" in str(e), e
    ok("an unknown tool is a protocol error")

    o = await s.call_tool("open_session", {"languages": ["python", "shell"]})
    assert not o.is_error, text(o)
    handle = o.structured_content["session"]
    assert re.match(r"^s-[0-9a-f]{32}$", handle), handle
    fingerprint = o.structured_content["fingerprint"]
    assert HEX64.match(fingerprint), o.structured_content
    r1 = await run(s, {"language": "python", "code": "x = 41", "session": handle})
    r2 = await run(s, {"language": "python", "code": "print(x + 1)", "session": handle})
    assert r2.structured_content["stdout"] == "42\n", r2.structured_content
    assert r2.structured_content["sequence"] == 2, r2.structured_content
    assert r2.structured_content["previous_sha256"] == r1.structured_content["record_sha256"]
    r3 = await run(s, {"language": "python", "code": "print(open('config/greeting.txt').read().strip())", "session": handle})
    assert r3.structured_content["stdout"] == GREETING + "\n", r3.structured_content
    r4 = await run(s, {"language": "shell", "code": "echo kept > kept.txt; cat kept.txt", "session": handle})
    assert r4.structured_content["stdout"] == "kept\n" and r4.structured_content["sequence"] == 4
    ok("a session keeps a Python variable and chains its records; call files reach session calls")

    c = await s.call_tool("close_session", {"session": handle})
    assert not c.is_error, text(c)
    sc = c.structured_content
    assert sc["fingerprint"] == fingerprint and sc["calls"] == 4, sc
    assert sc["last_record_sha256"] == r4.structured_content["record_sha256"], sc
    r = await run(s, {"language": "python", "code": "print(x)", "session": handle}, want_error=True)
    assert "no open session" in text(r), text(r)
    ok("close_session answers the fingerprint, call count and last digest")

    d = await s.call_tool("describe", {})
    assert not d.is_error and d.structured_content["isolation"] == "process", d.structured_content
    assert "tier process" in text(d), text(d)
    res = await s.read_resource("plimsoll://describe")
    body = json.loads(res.contents[0].text)
    assert body["isolation"] == "process" and body["protocol"] == 5, body
    ok("describe, and the plimsoll://describe resource")


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await scenario(s)
    elif mode == "http":
        url, token = sys.argv[2], sys.argv[3]
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                r, w = streams[0], streams[1]
                async with ClientSession(r, w) as s:
                    await scenario(s)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("all checks passed", flush=True)


asyncio.run(main())
