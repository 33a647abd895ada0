"""No answer is read past `http.ANSWER_MAX_BYTES` decoded, and the memory an answer takes stays near it
whatever its encoding: deflate unpacks some 1,000 times over, so one 64 KiB chunk off the wire of a
crafted gzip answer (a "bomb") holds some 64 MiB, and a gzip of a gzip multiplies that again. Real
sockets, a standard library server in a thread, the memory Python allocates measured (tracemalloc)
while the call runs. And the answer handed on, read whole and decoded, says so in its headers."""

import contextlib
import gzip
import threading
import tracemalloc
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ledger.connectors import http

MIB = 1024 * 1024
# What reading an answer may hold past ANSWER_MAX_BYTES: a piece being decoded, the decoder's state,
# the body's own room to grow.
SLACK = 2 * MIB


def _packed(wbits, size=200 * MIB):
    """`size` zero bytes compressed (zlib's `wbits`: gzip's format, zlib's for `deflate`, or raw
    deflate, which some servers send for it), made a megabyte at a time: a few hundred kilobytes
    that unpack to `size`."""
    packer, block = zlib.compressobj(9, zlib.DEFLATED, wbits), bytes(MIB)
    return b"".join([*(packer.compress(block) for _ in range(size // MIB)), packer.flush()])


@pytest.fixture(scope="module")
def bombs():
    gzipped = _packed(zlib.MAX_WBITS | 16)
    return {
        "gzip": (gzipped, "gzip"),
        "deflate": (_packed(zlib.MAX_WBITS), "deflate"),
        "raw_deflate": (_packed(-zlib.MAX_WBITS), "deflate"),
        "gzip_of_gzip": (gzip.compress(gzipped, 9), "gzip, gzip"),  # a few kilobytes
    }


class Answering(BaseHTTPRequestHandler):
    """Answers every request 200 with `content`, its `Content-Encoding` `encoding` (none if
    empty), and records the request's Accept-Encoding."""

    protocol_version = "HTTP/1.1"
    content, encoding, asked = b"", "", []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.asked.append(self.headers.get("Accept-Encoding"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.encoding:
            self.send_header("Content-Encoding", self.encoding)
        self.send_header("Content-Length", str(len(self.content)))
        self.end_headers()
        self.wfile.write(self.content)

    def handle(self):
        with contextlib.suppress(ConnectionError):  # the client reset the connection, done reading at the bound
            super().handle()

    def log_message(self, *args):
        pass


@pytest.fixture
def provider():
    Answering.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def answering(content, encoding=""):
    Answering.content, Answering.encoding = content, encoding


def peak_while(call):
    """What `call` raised, and the most memory Python held over what it held before, while it ran."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        try:
            call()
        except http.ProviderError as exc:
            raised = exc
        else:
            raised = None
        return raised, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("bomb", ["gzip", "deflate", "raw_deflate", "gzip_of_gzip"])
def test_an_answer_that_unpacks_past_the_bound_is_cut_within_a_small_margin_of_it(settings, provider, bombs,
                                                                                  bomb):
    settings.CONNECTOR_TIMEOUT = 10
    answering(*bombs[bomb])

    raised, peak = peak_while(lambda: http.call("POST", f"{provider}/v1/refunds", json={"key": "k"}))

    assert isinstance(raised, http.OutcomeUnknown)
    assert raised.code == "unreadable_answer", raised
    assert peak < http.ANSWER_MAX_BYTES + SLACK, f"{peak / MIB:.1f} MiB held"


def test_an_answer_just_within_the_bound_is_read_whole(settings, provider):
    settings.CONNECTOR_TIMEOUT = 10
    body = b'{"id": "re_1", "pad": "' + b"x" * (http.ANSWER_MAX_BYTES - 100) + b'"}'
    answering(gzip.compress(body), "gzip")

    answer = http.call("POST", f"{provider}/v1/refunds", json={"key": "k"})

    assert (answer["id"], len(answer["pad"])) == ("re_1", http.ANSWER_MAX_BYTES - 100)


def test_an_answer_at_the_bound_is_held_once_while_it_is_read(settings, provider):
    """The body read is handed on as it is, not copied: a copy held the answer twice, 20 MiB for
    a 10 MiB one, at its end. (The answer's JSON, which `call` reads after, is not measured.)"""
    settings.CONNECTOR_TIMEOUT = 10
    body = b'{"id": "re_1", "pad": "' + b"x" * (http.ANSWER_MAX_BYTES - 25) + b'"}'
    assert len(body) == http.ANSWER_MAX_BYTES
    answering(gzip.compress(body), "gzip")

    answer = []
    raised, peak = peak_while(lambda: answer.append(http.exchange("POST", f"{provider}/v1/refunds", json={})))

    assert raised is None and answer[0].content == body
    assert peak < http.ANSWER_MAX_BYTES + SLACK, f"{peak / MIB:.1f} MiB held"


def _raw_deflate(content):
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(content) + packer.flush()


@pytest.mark.parametrize(("content", "encoding"), [
    (zlib.compress(b'{"id": "re_1"}'), "deflate"),
    (_raw_deflate(b'{"id": "re_1"}'), "deflate"),  # raw, not zlib's format: what some servers send for deflate
    (gzip.compress(b'{"id": "re_1"}'), "identity, gzip"),
], ids=["deflate", "raw_deflate", "identity_gzip"])
def test_an_answer_in_a_coding_read_is_decoded(provider, content, encoding):
    answering(content, encoding)

    assert http.call("POST", f"{provider}/v1/refunds", json={"key": "k"}) == {"id": "re_1"}


@pytest.mark.parametrize(("content", "encoding"), [
    (b"\x1b\x0d\x00\xf8\xa5@\x02", "br"),
    (b"\x28\xb5\x2f\xfd\x00\x58\x01\x00\x00", "zstd"),
    (b"\x1f\x9d\x90", "compress"),
    (_raw_deflate(b'{"id": "re_1"}')[:-3], "deflate"),  # raw deflate cut short
    (_raw_deflate(b'{"id": "re_1"}') + b"more", "deflate"),  # and with more after its end
], ids=["br", "zstd", "compress", "raw_deflate_cut", "raw_deflate_and_more"])
def test_an_answer_in_a_coding_not_read_is_unreadable(provider, content, encoding):
    """Whatever decoders happen to be installed: an answer left encoded would be taken for the body
    itself, and brotli's and zstd's unpack far more than deflate's. Only gzip is asked for."""
    answering(content, encoding)

    with pytest.raises(http.OutcomeUnknown) as raised:
        http.call("POST", f"{provider}/v1/refunds", json={"key": "k"})

    assert raised.value.code == "unreadable_answer"
    assert Answering.asked == ["gzip"]


def test_the_answer_handed_on_describes_its_decoded_body(provider):
    """Read whole and decoded, the answer no longer is what came over the wire: a Content-Length
    kept from the wire (the compressed length) would disagree with the body handed on, and a
    Content-Encoding kept would have it decoded again."""
    body = b'{"id": "re_1", "note": "' + b"a" * 5000 + b'"}'
    answering(gzip.compress(body), "gzip")

    answer = http.exchange("POST", f"{provider}/v1/refunds", json={"key": "k"})

    assert answer.content == body
    assert answer.headers.get_list("Content-Length") == [str(len(body))]
    assert "Content-Encoding" not in answer.headers
