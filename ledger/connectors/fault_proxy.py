"""A local HTTP reverse proxy the replay run starts in front of a provider's base URL, so that
faults are staged by Surety itself and no provider needs a faults endpoint.

The connector is pointed at the proxy (`connector.through(proxy.url)`); every request is
forwarded to the provider unchanged (the path kept, the Host the provider's), and its answer
passed back, except for the next writes (a method other than GET or HEAD) a fault is armed
for:

- `timeout_after_commit`: forwarded, the provider's whole answer read (so it committed), then
  withheld for `hold` seconds (past CONNECTOR_TIMEOUT) and the connection closed unanswered;
- `lost_before_provider`: never forwarded, the connection closed unanswered;
- `error_500_after_commit`: forwarded, then answered 500 (the provider's answer discarded);
- `error_500_before_commit`: answered 500, never forwarded.

`staged` lists what was done, as a replay case's evidence. A provider that cannot be reached
is answered 502 with the reason (a connection refused is no answer a provider gave). Request
bodies are read by their Content-Length, as the connectors' HTTP clients send them.
"""

import contextlib
import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from .http import NoCookies

FAULTS = ("timeout_after_commit", "lost_before_provider", "error_500_after_commit", "error_500_before_commit")
_READS = ("GET", "HEAD")
# Not passed on: they describe one connection, not the request (RFC 9110, 7.6.1), or were
# undone by reading the body whole (its length, its encoding).
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
               "host", "content-length", "content-encoding"}
# How long the provider may take to answer the proxy: far past any connector's deadline, so
# that the connector's own timeout, not the proxy's, ends a slow call.
_UPSTREAM_TIMEOUT = 60


class FaultProxy:
    """A local HTTP reverse proxy the replay run starts in front of a provider's base URL, so that
    faults are staged by Surety itself and no provider needs a faults endpoint."""

    def __init__(self, upstream, *, hold=None):
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{upstream!r} is not an http(s) base URL")
        self.upstream = upstream.rstrip("/")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._prefix = parts.path.rstrip("/")
        self.hold = settings.CONNECTOR_TIMEOUT + 1 if hold is None else hold
        self.staged = []
        self.url = ""
        self._armed = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = self._thread = self._client = None

    def __enter__(self):
        self._client = httpx.Client(timeout=_UPSTREAM_TIMEOUT, follow_redirects=False, cookies=NoCookies())
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{self._prefix}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._closing.set()  # a held answer is given up now, not after `hold`
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._client.close()

    def arm(self, fault, times=1):
        """The next `times` writes (not GET or HEAD) get `fault`."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
        with self._lock:
            self._armed.extend([fault] * times)

    def disarm(self):
        """Forget the faults no write has taken yet; return them."""
        with self._lock:
            left, self._armed = list(self._armed), deque()
        return left

    def _fault_for(self, method):
        with self._lock:
            return self._armed.popleft() if method not in _READS and self._armed else None

    def _forward(self, method, path, headers, body):
        """The provider's answer to the request: (status, headers, body)."""
        passed = {name: value for name, value in headers.items() if name.lower() not in _HOP_BY_HOP}
        answer = self._client.request(method, f"{self._origin}{path}", headers=passed, content=body)
        return answer.status_code, [(n, v) for n, v in answer.headers.items() if n.lower() not in _HOP_BY_HOP], \
            answer.content

    def _handle(self, request):
        """One request: forwarded or faulted, answered or dropped (1-3 of the module's list)."""
        method, path = request.command, request.path
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        fault = self._fault_for(method)
        record = {"fault": fault, "method": method, "path": path, "upstream_status": None}
        if fault in ("lost_before_provider", "error_500_before_commit"):
            self.staged.append(record)
            return _drop(request) if fault == "lost_before_provider" else _answer_500(request, fault)
        try:
            status, headers, content = self._forward(method, path, request.headers, body)
        except httpx.HTTPError as exc:
            if fault:
                self.staged.append({**record, "upstream_error": repr(exc)})
            return _answer(request, 502, [("Content-Type", "application/json")], json.dumps(
                {"error": {"code": "provider_unreachable", "message": f"{self.upstream}: {exc!r}"}}).encode())
        if fault is None:
            return _answer(request, status, headers, content)
        self.staged.append({**record, "upstream_status": status, "upstream_body": content[:500].decode(errors="replace")})
        if fault == "error_500_after_commit":
            return _answer_500(request, fault)
        self._closing.wait(self.hold)
        return _drop(request)


def _handler_for(proxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one_request(self):
            try:
                super().handle_one_request()
            except (ConnectionError, TimeoutError):  # the client gave up first (a timeout it was staged for)
                self.close_connection = True

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            pass

        def do_GET(self):  # noqa: N802 (http.server's names, as for each method below)
            proxy._handle(self)

        do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET  # noqa: N815

    return Handler


def _answer(request, status, headers, content):
    request.send_response(status)
    for name, value in headers:
        request.send_header(name, value)
    request.send_header("Content-Length", str(len(content)))
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(content)


def _answer_500(request, fault):
    _answer(request, 500, [("Content-Type", "application/json")],
            json.dumps({"error": {"code": "staged_fault", "message": f"staged by Surety: {fault}"}}).encode())


def _drop(request):
    """Close the connection without a byte of answer."""
    request.close_connection = True
    with contextlib.suppress(OSError):
        request.connection.shutdown(2)
