"""CONNECTOR_TIMEOUT is one deadline for the whole call: a provider that answers a byte at a
time (each read well inside httpx's per-phase timeout) is still cut off at the deadline, as
an outcome unknown. A real HTTP server on a free port, no mock."""

import socket
import threading
import time

import pytest

from ledger.connectors import http
from tests.conftest import free_port


@pytest.fixture
def trickling_server():
    """Answers every request with a 200 whose 20-byte body comes one byte every 0.1 s."""
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n")
                for byte in b'{"id": "re_slow_1"} ':
                    if stop.is_set():
                        break
                    time.sleep(0.1)
                    try:
                        conn.sendall(bytes([byte]))
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    stop.set()
    thread.join(5)
    listener.close()


def test_a_trickling_answer_is_cut_off_at_the_deadline(settings, trickling_server):
    settings.CONNECTOR_TIMEOUT = 0.5  # each byte comes in 0.1 s: no single read ever times out
    started = time.monotonic()
    with pytest.raises(http.OutcomeUnknown) as caught:
        http.call("POST", f"{trickling_server}/refunds", json={"amount": "1.00"})
    assert time.monotonic() - started < 1.0
    assert caught.value.code == "timeout"


def test_an_answer_inside_the_deadline_is_read_whole(settings, trickling_server):
    settings.CONNECTOR_TIMEOUT = 4.0  # the whole body takes 2 s
    assert http.call("GET", f"{trickling_server}/refunds") == {"id": "re_slow_1"}
