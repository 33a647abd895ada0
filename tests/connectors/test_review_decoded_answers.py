"""A gzipped answer is taken as the provider's answer only when its gzip stream came whole: one cut
short, or with more after its end, is `unreadable_answer`, as a body its coding does not decode is.
zlib hands back what it unpacked so far and says nothing of a stream that stops early, nor of what
follows its end, so a cut answer read as a whole one (a write's answer, a listing's page) was taken
for what the provider said. `x-gzip` is gzip (RFC 9110 8.4.1.3); an empty body is empty in any
coding. Real sockets, a standard library server in a thread."""

import contextlib
import gzip
from http.server import BaseHTTPRequestHandler

import pytest

from ledger.connectors import http
from tests.conftest import thread_server

ANSWER = b'{"id": "re_1", "amount": 100}'
GZIPPED = gzip.compress(ANSWER)


def answering(content, encoding, status=200):
    """A handler that answers every request `status` with `content` as it is, in `encoding`."""

    class Answer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", encoding)
            if status != 204:  # a 204 has no body, nor a length
                self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

        def handle(self):
            with contextlib.suppress(ConnectionError):  # the client reset the connection, done reading
                super().handle()

        def log_message(self, format, *args):  # noqa: A002
            pass

    return Answer


def posted(content, encoding, status=200):
    with thread_server(answering(content, encoding, status)) as provider:
        return http.call("POST", f"{provider.url}/v1/refunds", json={"key": "k"})


@pytest.mark.parametrize("content", [
    GZIPPED[:-8],  # its trailer (the CRC and the length) missing: the data is all there, unchecked
    GZIPPED[:-12],  # cut within the data
    GZIPPED + b"more",  # something after the end of the stream
    GZIPPED + gzip.compress(b'{"id": "re_2"}'),  # a second stream, which would have been dropped unread
], ids=["no_trailer", "cut_in_the_data", "trailing_bytes", "a_second_member"])
def test_a_gzip_stream_that_is_not_whole_is_unreadable(content):
    with pytest.raises(http.OutcomeUnknown) as raised:
        posted(content, "gzip")

    assert raised.value.code == "unreadable_answer"


@pytest.mark.parametrize("encoding", ["x-gzip", " GZip ", "X-GZIP"])
def test_x_gzip_is_gzip_in_any_case(encoding):
    assert posted(GZIPPED, encoding) == {"id": "re_1", "amount": 100}


def test_an_empty_answer_in_gzip_is_empty():
    """A 204 (or any empty body) labelled gzip carries no stream at all: nothing to be cut."""
    with thread_server(answering(b"", "gzip", status=204)) as provider:
        answer = http.exchange("POST", f"{provider.url}/v1/refunds", json={"key": "k"})

    assert (answer.status_code, answer.content) == (204, b"")
