"""A TCP relay in front of the test server whose first connections lose their answer."""

import socket
import threading


class AnswerLosingProxy:
    """Relays connections to the server at `upstream_port`. The first `lose` connections reach
    the server with their whole request, and are closed as soon as its answer starts: the
    request took effect, the caller never hears so (a real dropped connection, not a mock)."""

    def __init__(self, upstream_port, lose=1):
        self.upstream_port = upstream_port
        self.lose = lose
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                caller, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._relay, args=(caller, self.connections <= self.lose), daemon=True).start()

    def _relay(self, caller, lose_answer):
        server = socket.create_connection(("127.0.0.1", self.upstream_port))
        threading.Thread(target=_pump, args=(caller, server), daemon=True).start()
        if lose_answer:
            server.recv(1)  # the server has handled the request and starts answering
        else:
            _pump(server, caller)
        for end in (caller, server):
            try:
                end.shutdown(socket.SHUT_RDWR)  # wakes the other pump's recv
            except OSError:
                pass
            end.close()


def _pump(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the other side closed
