"""plimsoll_grant: the sandbox side of a plimsoll grant (Python 3.8+, standard library only).

It finds the run's relay from the environment (PLIMSOLL_GRANT_URL or PLIMSOLL_GRANT_SOCKET,
and PLIMSOLL_GRANT_SECRET) and sends each call there. It never sees the API's credential or
address: the broker, outside the sandbox, checks each call against the grant, attaches the
credential and forwards it.

    import plimsoll_grant as grant
    r = grant.post("/v1/memories", {"key": "k", "text": "hello"})
    r.status, r.ok, r.refused, r.content_type, r.body   # body parsed when it is JSON

A call the grant does not allow answers 403 with r.refused set and a JSON reason.
"""

import http.client
import json
import os
import socket
from urllib.parse import urlsplit

__all__ = ["Response", "request", "get", "post", "put", "patch", "delete"]


class Response:
    """One answer: status, ok (2xx), refused (by the broker), content_type, body."""

    def __init__(self, status, refused, content_type, body):
        self.status = status
        self.ok = 200 <= status < 300
        self.refused = refused
        self.content_type = content_type
        self.body = body

    def __repr__(self):
        return "Response(status=%d, refused=%r, body=%r)" % (self.status, self.refused, self.body)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def _connection(timeout):
    url = os.environ.get("PLIMSOLL_GRANT_URL")
    path = os.environ.get("PLIMSOLL_GRANT_SOCKET")
    secret = os.environ.get("PLIMSOLL_GRANT_SECRET")
    if not secret or not (url or path):
        raise RuntimeError(
            "this run has no grant: PLIMSOLL_GRANT_URL (or PLIMSOLL_GRANT_SOCKET) "
            "and PLIMSOLL_GRANT_SECRET are unset"
        )
    if path:
        return _UnixConnection(path, timeout), secret
    u = urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout), secret


def request(method, path, body=None, content_type=None, accept="application/json", timeout=60):
    """Sends one call through the relay and returns a Response."""
    conn, secret = _connection(timeout)
    headers = {"x-plimsoll-grant-secret": secret, "accept": accept}
    payload = None
    if body is not None:
        if isinstance(body, (bytes, bytearray)):
            payload = bytes(body)
            headers["content-type"] = content_type or "application/octet-stream"
        elif isinstance(body, str):
            payload = body.encode("utf-8")
            headers["content-type"] = content_type or "text/plain; charset=utf-8"
        else:
            payload = json.dumps(body).encode("utf-8")
            headers["content-type"] = content_type or "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        res = conn.getresponse()
        raw = res.read()
        ct = res.getheader("content-type", "")
        refused = res.getheader("x-plimsoll-broker", "") == "refused"
        parsed = raw.decode("utf-8", "replace")
        if "json" in ct.lower() and raw:
            try:
                parsed = json.loads(parsed)
            except ValueError:
                pass
        return Response(res.status, refused, ct, parsed)
    finally:
        conn.close()


def get(path, **kw):
    return request("GET", path, **kw)


def delete(path, **kw):
    return request("DELETE", path, **kw)


def post(path, body=None, **kw):
    return request("POST", path, body, **kw)


def put(path, body=None, **kw):
    return request("PUT", path, body, **kw)


def patch(path, body=None, **kw):
    return request("PATCH", path, body, **kw)
