"""Every outbound HTTP call goes through here: explicit timeouts and three kinds of failure.

- `NotSent`: the request provably never reached the provider (no connection). Safe to retry.
- `OutcomeUnknown`: it may have been received and acted on (timeout while waiting, dropped
  connection, 5xx). Never retried blindly: the effect must be looked up first.
- `Rejected`: the provider answered with a definite no (4xx, a decline). Permanent.

`CONNECTOR_TIMEOUT` is one deadline for the whole call, and no byte of a request leaves this
process after it. httpx's timeouts hold per phase (connect, write, each read), and name
resolution has none, so a provider that answers a byte at a time, or a slow resolver followed by
a slow send, could keep a call going far past it, and past the lease the executor checked before
calling (DESIGN: a worker never starts a call it may not finish inside its lease). So:

- The call runs on a thread of its own and the caller waits for it at most until the deadline:
  then it is `OutcomeUnknown` (or `NotSent` if not a byte of the request had been handed to a
  socket yet), and whatever arrives later is dropped.
- Every socket operation of the call goes through `_Backend`/`_Stream` (httpcore's own network
  backend, wrapped), which refuse to connect, shake hands, write or read once the deadline has
  passed or the call was cut off, and give each operation at most the time left.
- At the deadline the caller cuts the call off: it shuts down the sockets the call is using, so
  that a write blocked on one (a provider that takes the body slowly) or about to start on one
  fails at once. Every connection is opened with SO_LINGER 0, so the close that follows on the
  call's thread resets it (RST) and the kernel drops what it still held of the request, rather
  than going on sending it. The caller waits for that close (at most `_CUT_OFF_GRACE`, which
  the thread, woken by the shutdown, needs only a moment of) before it returns.

The guarantee, precisely: no write of a request starts after its call's deadline; a write under
way then is cut off as soon as the caller's thread runs at the deadline; and what the kernel had
not yet sent is dropped by the reset, which the call's thread does as soon as the shutdown wakes
it, and the caller waits for (`_CUT_OFF_GRACE` at most). Until the reset the kernel may pass on
some more of what it already held (a shutdown alone sends it, then a FIN); nothing is added to
it. So a request still on its way at the deadline is not completed later, unless the call's
thread gets no CPU for longer than the grace, and the provider reads the rest within it
(tests/connectors/test_http_deadline.py).
What reached the provider before the deadline stays there, and a provider may still act on a
request it received whole in time: that is why the executor looks for the effect only
`CONNECTOR_TIMEOUT` after the call returned, and the sweeper only `CONNECTOR_TIMEOUT` after the
lease's end, which the deadline of a connector's write never passes (ledger.connectors.base).
A worker killed mid-call sends nothing more either: its kernel resets the connections it leaves
(SO_LINGER 0). The resolver has no timeout, so a connection may be opened after the deadline;
it carries nothing and is reset at once. Not covered: a process frozen whole (SIGSTOP, a paused
VM) cannot cut its calls off, and its kernel may go on sending what it held; there, as with any
lease, the provider's own idempotency key is what is left.

`deadline()` makes several calls share one deadline: a connector's write and look-up are held to
one (ledger.connectors.base), however many requests they make; the Stripe SDK's requests go
through `exchange` too (ledger.connectors.stripe).
"""

import contextlib
import contextvars
import io
import itertools
import json
import os
import re
import socket
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as DeadlinePassed
from concurrent.futures import wait
from datetime import UTC
from email.utils import parsedate_to_datetime
from http.cookiejar import CookieJar

import httpcore
import httpx
from django.conf import settings

from .. import clock
from ..compiled import register_cache


# A failure code as the action's error keeps it (docs/contract.md: its `code` is text): 1 to 64
# ASCII letters, digits, `_`, `-` and `.`, as providers write theirs.
_READABLE_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# What a code that is not one becomes, and how much of what came is kept in the message instead.
UNREADABLE_CODE = "unreadable_code"
_UNREADABLE_SHOWN_CHARS = 200
# The longest failure message, the provider's words in it included (docs/contract.md); a longer
# one keeps its start and says how long it was.
MESSAGE_MAX_CHARS = 1000
# The most of an answer read, decoded (docs/connectors.md): an answer that runs longer is an unknown
# outcome. Stripe's and the sandbox's largest pages (100 refunds, 1,000 effects) are well within it.
ANSWER_MAX_BYTES = 10 * 1024 * 1024
# The content codings an answer is read in (`_decoded`): zlib reads both formats (gzip's, and
# deflate's own, RFC 9110 8.4.1.2; x-gzip is gzip, 8.4.1.3), and raw deflate, which some servers
# send for deflate, at most _DECODED_PIECE bytes a step, so that the bound is looked at within
# that of it. Only gzip is asked for.
_CODINGS = ("gzip", "x-gzip", "deflate")
_ZLIB_OR_GZIP = zlib.MAX_WBITS | 32
_RAW_DEFLATE = -zlib.MAX_WBITS
_ACCEPTED_ENCODING = "gzip"
_DECODED_PIECE = 64 * 1024


def said(value):
    """What a provider's answer said (its error's message, a failure's reason) as text for a
    failure's message: a string as it came, any other JSON value (an object, a list, a number,
    true) its JSON text. How long it may be is ProviderError's to bound."""
    return value if isinstance(value, str) else json.dumps(value, default=repr, ensure_ascii=False)


def cut_message(text, room=MESSAGE_MAX_CHARS):
    """`text` if it fits in `room` characters (a message's bound by default), else as much of its
    start as fits with a marker saying how long it was."""
    if len(text) <= room:
        return text
    marker = f" … [cut: {len(text)} characters in all]"
    return text[:room - len(marker)] + marker


class ProviderError(Exception):
    """`code`: the failure's code, the connector's own or the one the provider's answer named
    (http.call, Stripe's SDK). Every code and message a provider's answer names reaches the ledger
    through here, so both are bounded here: a provider, or anything answering in its place, may put
    any JSON there (an object, a megabyte of text), and the action's error, its evidence and a
    task's last error would keep it, and every page and API read of the action carry it. A code
    that is no short string of the safe characters is `UNREADABLE_CODE`, the start of what came
    kept in the message. The message is at most MESSAGE_MAX_CHARS, a longer one cut (what says
    what an unreadable code was is kept whole, after it)."""

    def __init__(self, message, *, code="provider_error", status=None):
        unreadable = ""
        if not (isinstance(code, str) and _READABLE_CODE.fullmatch(code)):
            shown = json.dumps(code, default=repr)[:_UNREADABLE_SHOWN_CHARS]
            unreadable, code = f" (the provider's code, unreadable: {shown})", UNREADABLE_CODE
        super().__init__(cut_message(message, MESSAGE_MAX_CHARS - len(unreadable)) + unreadable)
        self.code = code
        self.status = status

    def evidence(self):
        return {"error": type(self).__name__, "code": self.code, "status": self.status, "message": str(self)}


class NotSent(ProviderError):
    """`retry_after`: the seconds the provider asked to be left alone for (a rate limit's), or None;
    the executor tries again no sooner."""

    def __init__(self, message, *, retry_after=None, **kwargs):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after

    def evidence(self):
        asked = {} if self.retry_after is None else {"retry_after": self.retry_after}
        return {**super().evidence(), **asked}


class OutcomeUnknown(ProviderError):
    pass


class Rejected(ProviderError):
    pass


# The wait after a rate limit (429) whose answer names none that can be read (Stripe names none):
# a per-minute quota, the commonest window, has rolled over by then.
RATE_LIMITED_WAIT_SECONDS = 60
# The longest wait a provider's Retry-After is taken at: one that asks for a day (or a date a
# clock gone wrong wrote) is tried again within the hour, and after MAX_ATTEMPTS a person hears.
RETRY_AFTER_MAX_SECONDS = 3600
# A connection's close resets it (RST) and drops what the kernel had not sent yet, instead of
# sending it on after the close; the kernel does the same for a worker that is killed.
_RESET_ON_CLOSE = (socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
# How long a caller that cut its call off waits for the call's thread to close the connection.
_CUT_OFF_GRACE = 0.2
# The call the current thread is making, if any (set by `_run`, read by the network streams).
_running = contextvars.ContextVar("connector_call", default=None)
# The deadline every call made inside `deadline()` shares (time.monotonic()), if any.
_shared_deadline = contextvars.ContextVar("connector_deadline", default=None)
# The watch (`rate_limit_watched()`) the current calls report their answers to, if any.
_watch = contextvars.ContextVar("connector_rate_limit_watch", default=None)


@contextlib.contextmanager
def deadline(seconds=None):
    """Hold every call made inside to one deadline, `seconds` (CONNECTOR_TIMEOUT by default) from
    now, or to the enclosing one if that is sooner."""
    at = time.monotonic() + (settings.CONNECTOR_TIMEOUT if seconds is None else max(seconds, 0))
    outer = _shared_deadline.get()
    token = _shared_deadline.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _shared_deadline.reset(token)


class RateLimitWatch:
    """Whether the last call made inside `rate_limit_watched()` was answered 429: `retry_after`, the
    wait that answer named (as `retry_after()` reads it), else None (another answer, or none)."""

    retry_after = None


@contextlib.contextmanager
def rate_limit_watched():
    """Watch the calls made inside for a rate limit, whatever reads their answers (`call`, an SDK
    given `exchange`): a look-up that could not tell tells the executor so whether the provider
    only asked to be left alone (ledger.connectors.base)."""
    watch = RateLimitWatch()
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)


def time_left():
    """Seconds left of the shared deadline (inside `deadline()`), else CONNECTOR_TIMEOUT: for a
    connector whose provider is not called over HTTP (SMTP) to hold its conversation to it."""
    shared = _shared_deadline.get()
    return settings.CONNECTOR_TIMEOUT if shared is None else shared - time.monotonic()


class _Over(Exception):
    """The call's deadline passed, or its caller cut it off."""


class _TooLong(Exception):
    """The answer, its status `status`, ran past ANSWER_MAX_BYTES."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


class _Call:
    """One call's deadline, whether a byte of its request may have been handed to a socket, and
    the connections it is using, so that its caller can cut it off."""

    def __init__(self, at):
        self.at = at
        self.sent = False
        self._over = False
        self._streams = set()
        self._lock = threading.Lock()

    def left(self):
        return self.at - time.monotonic()

    def enter(self, stream, timeout, *, sending=False):
        """Called before every operation on `stream`: refuses once the call is over, else returns
        the operation's timeout, at most what is left. A stream entered here is cut off with the
        call, so an operation that passed this check and starts after the cut-off fails."""
        with self._lock:
            left = self.left()
            if self._over or left <= 0:
                raise _Over
            self._streams.add(stream)
            stream.owner = self
            if sending:
                self.sent = True
        return left if timeout is None else min(timeout, left)

    def finish(self):
        """The call's thread is done with it: its connections went back to the pool, where another
        call may take them, so a cut-off from now on must not touch them."""
        with self._lock:
            self._over = True
            self._streams.clear()

    def cut_off(self):
        """At the deadline: nothing more of this call may start, and what runs fails now."""
        with self._lock:
            self._over = True
            streams = list(self._streams)
        for stream in streams:
            if stream.owner is self:  # not one the pool has given another call since
                stream.abort()
        return bool(streams)


class _Stream(httpcore.NetworkStream):
    """httpcore's stream, held to the deadline of whichever call is using it (a pooled connection
    serves many calls, one at a time)."""

    def __init__(self, inner):
        self._inner = inner
        self._lock = threading.Lock()
        self._closed = False
        self.owner = None  # the call that last used it

    def _timeout(self, timeout, timed_out, *, sending=False):
        call = _running.get()
        if call is None:
            return timeout
        try:
            return call.enter(self, timeout, sending=sending)
        except _Over:
            raise timed_out("the call's deadline has passed") from None

    def read(self, max_bytes, timeout=None):
        return self._inner.read(max_bytes, self._timeout(timeout, httpcore.ReadTimeout))

    def write(self, buffer, timeout=None):
        if buffer:
            self._inner.write(buffer, self._timeout(timeout, httpcore.WriteTimeout, sending=True))

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        timeout = self._timeout(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info):
        return self._inner.get_extra_info(info)

    def close(self):
        with self._lock:
            self._closed = True
            self._inner.close()

    def abort(self):
        """Shut the connection down from another thread: a write or read blocked on it, or about
        to start, fails at once; the close that follows resets it (SO_LINGER 0)."""
        with self._lock:
            sock = None if self._closed else self._inner.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # socket.socket's own: an SSLSocket's shutdown would also drop its TLS state
                    # under the thread still using it.
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Backend(httpcore.SyncBackend):
    """httpcore's network backend, with every connection's streams held to their call's deadline."""

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        call = _running.get()
        if call is not None:
            left = call.left()
            if left <= 0:
                raise httpcore.ConnectTimeout("the call's deadline has passed")
            timeout = left if timeout is None else min(timeout, left)
        # The resolver has no timeout: it may answer after the deadline, and the TCP handshake
        # (which carries nothing of the request) may then follow, but nothing more.
        stream = _Stream(super().connect_tcp(host, port, timeout, local_address,
                                             [*(socket_options or ()), _RESET_ON_CLOSE]))
        if call is not None:
            try:
                call.enter(stream, None)
            except _Over:
                stream.close()
                raise httpcore.ConnectTimeout("the call's deadline passed while connecting") from None
        return stream


_BACKEND = _Backend()


class _Client(httpx.Client):
    """httpx's own client, each of whose transports (the direct one, and one through a proxy the
    environment names) connects through `_Backend`. httpx builds its transports here; httpcore's
    pool takes its network backend from `_network_backend` (httpx <0.29, httpcore 1.x:
    pyproject.toml; tests/connectors/test_http_deadline.py fails if either stops doing so)."""

    def _init_transport(self, *args, **kwargs):
        return _held(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args, **kwargs):
        return _held(super()._init_proxy_transport(*args, **kwargs))


def _held(transport):
    transport._pool._network_backend = _BACKEND
    return transport


class NoCookies(CookieJar):
    """A jar that keeps nothing. One pooled client serves every agent's and connector's calls: a
    cookie a provider sets in answer to one (a session, a load balancer's pin) must not ride along
    on the next, which may carry another credential. httpx has no switch for it. (The replay's
    fault proxy forwards with one too, so a replay run calls as production does.)"""

    def extract_cookies(self, response, request):
        pass

    def set_cookie(self, cookie):
        pass


_clients = {}


def _close_clients():
    """Close the pooled connections too: an idle one may hold a server's thread (and its
    database connection) open."""
    for client in _clients.values():
        client.close()
    _clients.clear()


register_cache("ledger.connectors.http._clients", holds="one pooled HTTP client per process", clear=_close_clients,
               stale_when="the process forks (the key is its pid)")


def _client():
    # One pooled client per process (workers may be forked after import).
    pid = os.getpid()
    if pid not in _clients:
        _clients.clear()
        _clients[pid] = _Client(timeout=settings.CONNECTOR_TIMEOUT, follow_redirects=False, cookies=NoCookies(),
                                headers={"Accept-Encoding": _ACCEPTED_ENCODING})
    return _clients[pid]


# Calls in flight at once per process: the drain lanes' and the web side's alerts, with room
# for calls past their deadline that are still finishing in the background (one that was cut off
# ends at once; one still resolving a name ends when the resolver answers).
_calls = ThreadPoolExecutor(max_workers=64, thread_name_prefix="provider-call")


def _run(call, method, url, kwargs):
    token = _running.set(call)
    try:
        with _client().stream(method, url, timeout=max(call.left(), 0.001), **kwargs) as response:
            return _read(response)
    finally:
        _running.reset(token)
        call.finish()


def _read(response):
    """`response` read whole, or `_TooLong` once it runs past ANSWER_MAX_BYTES (the connection is
    then closed unread). Counted as it decodes, so that a small gzipped answer that unpacks to a
    gigabyte is stopped too; httpx reads an answer whole, whatever its size, unless told so."""
    body = io.BytesIO()
    for piece in _decoded(response):
        body.write(piece)
        if body.tell() > ANSWER_MAX_BYTES:
            raise _TooLong(response.status_code)
    # The body is decoded already and whole: the response that holds it must neither decode it
    # again nor describe it as it came over the wire (its compressed length, its chunks).
    headers = [(name, value) for name, value in response.headers.multi_items()
               if name.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    # getvalue() hands over the buffer itself, not a copy of it (CPython's BytesIO, unshared):
    # a bytearray's bytes() held a 10 MiB answer twice.
    return httpx.Response(response.status_code, headers=headers, content=body.getvalue(), request=response.request)


def _decoded(response):
    """The body of `response` as it decodes, at most _DECODED_PIECE bytes at a time, whatever a
    piece of it off the wire unpacks to. Not httpx's decoders: they decode each chunk off the wire
    (up to 64 KiB) whole, and deflate unpacks some 1,000 times over, so one chunk of a crafted
    answer would hold 64 MiB before the bound was looked at, a gzip of a gzip far more; brotli and
    zstd, which httpx reads when their libraries happen to be installed, more still. zlib stops at
    `max_length`; only what it reads is asked for (`Accept-Encoding`, `_client`), and an answer in
    any other coding, or in a stack of them (which no server asked for gzip sends), is unreadable.

    So is a stream that is not whole: zlib hands back what it unpacked so far, and says nothing of
    a stream that stops before its end (cut short: its end, or its checksum, never came) nor of
    what follows its end (kept aside, uncounted, however much comes). An empty body has no stream."""
    codings = [coding for coding in (value.strip().lower() for value in
                                     response.headers.get_list("content-encoding", split_commas=True))
               if coding not in ("", "identity")]
    if not codings:
        yield from response.iter_raw()
        return
    if len(codings) > 1 or codings[0] not in _CODINGS:
        raise httpx.DecodingError(f"an answer in {', '.join(codings)}: only one of {', '.join(_CODINGS)} is read")
    pieces = response.iter_raw()
    head = b""
    for piece in pieces:  # the stream's first two bytes at least: zlib's header, if it has one
        head += piece
        if len(head) >= 2:
            break
    decompressor = _decompressor(codings[0], head)
    came = bool(head)
    try:
        for piece in itertools.chain([head], pieces):
            while piece:  # what zlib did not get to for want of room is its unconsumed tail
                yield decompressor.decompress(piece, _DECODED_PIECE)
                piece = decompressor.unconsumed_tail
            if decompressor.unused_data:
                raise httpx.DecodingError(f"more after the end of the answer's {codings[0]} stream")
        yield decompressor.flush()  # what it still holds once all came: less than a piece
    except zlib.error as exc:
        raise httpx.DecodingError(str(exc)) from exc
    if came and not decompressor.eof:
        raise httpx.DecodingError(f"the answer's {codings[0]} stream was cut short")


def _decompressor(coding, head):
    """zlib's reader of an answer in `coding` that starts with `head`: gzip's or zlib's format,
    told by its header; for deflate without zlib's header, raw deflate (RFC 1951 alone, which
    some servers send for deflate). zlib tells a header from its first two bytes."""
    if coding == "deflate":
        try:
            zlib.decompressobj(_ZLIB_OR_GZIP).decompress(head[:2])
        except zlib.error:
            return zlib.decompressobj(_RAW_DEFLATE)
    return zlib.decompressobj(_ZLIB_OR_GZIP)


def exchange(method, url, *, json=None, content=None, params=None, headers=None):
    """Send one request and return httpx's response, read whole, whatever its status, or raise
    `NotSent` or `OutcomeUnknown` if no whole answer came by the deadline (the shared one inside
    `deadline()`, else CONNECTOR_TIMEOUT from now), and `OutcomeUnknown` for one longer than
    ANSWER_MAX_BYTES."""
    watch = _watch.get()
    if watch is not None:
        watch.retry_after = None  # until this call is answered 429
    shared = _shared_deadline.get()
    call = _Call(shared if shared is not None else time.monotonic() + settings.CONNECTOR_TIMEOUT)
    if call.left() <= 0:
        raise NotSent(f"{method} {url}: the deadline had passed before the call", code="deadline_passed")
    request = _calls.submit(_run, call, method, url,
                            {"json": json, "content": content, "params": params, "headers": headers})
    try:
        response = request.result(timeout=max(call.left(), 0))
    except DeadlinePassed:
        if request.cancel():  # never started: every thread was busy
            raise NotSent(f"{method} {url}: no thread free to call within the deadline", code="busy") from None
        if call.cut_off():
            wait([request], timeout=_CUT_OFF_GRACE)  # its thread closes (resets) the connection
        if not call.sent:
            raise NotSent(f"{method} {url}: no connection within the deadline; nothing was sent",
                          code="connect_failed") from None
        raise OutcomeUnknown(f"{method} {url}: no complete answer within the deadline", code="timeout") from None
    except _TooLong as exc:
        # The provider answered, so it may have acted on the request, whatever the status says:
        # an answer that cannot be read whole is no refusal, nor a success, nor a "not now".
        raise OutcomeUnknown(f"{method} {url}: HTTP {exc.status}, an answer longer than {ANSWER_MAX_BYTES} bytes, "
                             "not read further", code="unreadable_answer", status=exc.status) from None
    except httpx.DecodingError as exc:
        # A body its Content-Encoding does not decode (a broken gzip stream): an answer came, unread.
        raise OutcomeUnknown(f"{method} {url}: an answer that could not be decoded ({exc})",
                             code="unreadable_answer") from None
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise NotSent(f"{method} {url}: {exc!r}", code="connect_failed") from exc
    except httpx.TransportError as exc:
        if not call.sent:
            raise NotSent(f"{method} {url}: {exc!r}; nothing was sent", code="connect_failed") from exc
        if isinstance(exc, httpx.TimeoutException):
            raise OutcomeUnknown(f"{method} {url}: no answer within the deadline", code="timeout") from exc
        raise OutcomeUnknown(f"{method} {url}: {exc!r}", code="connection_lost") from exc
    if watch is not None and response.status_code == 429:
        watch.retry_after = retry_after(response.headers)
    return response


def call(method, url, *, json=None, content=None, params=None, headers=None):
    """Send one request; return the decoded JSON body of a 2xx answer or raise a ProviderError."""
    response = exchange(method, url, json=json, content=content, params=params, headers=headers)
    body = _json_or_text(response)
    if response.is_success:
        return body
    if response.status_code >= 500:
        raise OutcomeUnknown(
            f"{method} {url}: HTTP {response.status_code}", code=f"http_{response.status_code}",
            status=response.status_code,
        )
    if response.status_code == 429:
        raise NotSent(f"{method} {url}: rate limited", code="rate_limited", status=429,
                      retry_after=retry_after(response.headers))
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else f"http_{response.status_code}"
    message = said(error.get("message")) if isinstance(error, dict) else f"HTTP {response.status_code}"
    raise Rejected(f"{method} {url}: {message}", code=code or "rejected", status=response.status_code)


def retry_after(headers):
    """The seconds a rate-limited answer asks to be left alone for: its `Retry-After`, in seconds
    or an HTTP-date, at most RETRY_AFTER_MAX_SECONDS; RATE_LIMITED_WAIT_SECONDS if it names none
    that can be read. A date is the provider's clock: it is counted from the answer's own `Date`
    (by the database's clock only if there is none), so a provider's clock that runs ahead or
    behind ours neither stretches nor cuts the wait."""
    value = (headers.get("Retry-After") or "").strip()
    if value.isascii() and value.isdigit():
        seconds = int(value)
    elif (until := _http_date(value)) is not None:
        seconds = (until - (_http_date(headers.get("Date")) or clock.now())).total_seconds()
    else:
        return RATE_LIMITED_WAIT_SECONDS
    return min(max(seconds, 0), RETRY_AFTER_MAX_SECONDS)


def _http_date(value):
    """An HTTP-date as an aware datetime (one that names no zone is GMT, as HTTP's are), or None
    if `value` is not one."""
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# Answers to a write that are not the provider's "no": a redirect (a 303 says it was done, see
# there), 408 (the provider or a proxy gave up reading it, maybe after the body arrived) and 409
# (the IETF Idempotency-Key draft's "the first request under this key is still being processed").
# Read as refusals, the action would be failed for good while its effect may be made.
_NOT_A_REFUSAL = {408, 409}


def raise_if_no_refusal(exc, *, sure=()):
    """For a write's `Rejected`: raise `OutcomeUnknown` instead where the answer is no refusal
    (a redirect, 408, 409), unless its code is one of `sure`, the provider's own definite no."""
    if (exc.status < 400 or exc.status in _NOT_A_REFUSAL) and exc.code not in sure:
        raise OutcomeUnknown(str(exc), code=exc.code, status=exc.status) from exc


def _json_or_text(response):
    try:
        return response.json()
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return {"text": response.text[:2000]}
