"""TCP relays in front of the test server whose first connections fail, as real networks do, and in
front of PostgreSQL, cut and restored as a failover looks to the servers behind it."""

import socket
import threading
import time

# What happens to the first connections (the rest are relayed untouched):
#   lose  - the request reaches the server, which handles it; the connection closes as its
#           answer starts, so the caller never hears (a dropped connection)
#   stall - the same, but the answer is held for `stall` seconds first (a read timeout)
#   503   - a load balancer's 503 without reaching the server
FAILURES = ("lose", "stall", "503")
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FlakyProxy:
    def __init__(self, upstream_port, failure="lose", times=1, stall=3.0):
        assert failure in FAILURES
        self.upstream_port = upstream_port
        self.failure = failure
        self.times = times
        self.stall = stall
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=_serve, args=(self.listener, self._accepted), daemon=True).start()

    def close(self):
        self.listener.close()

    def _accepted(self, caller):
        self.connections += 1
        failing = self.connections <= self.times
        threading.Thread(target=self._relay, args=(caller, failing), daemon=True).start()

    def _relay(self, caller, failing):
        if failing and self.failure == "503":
            caller.recv(65536)
            caller.sendall(UNAVAILABLE)
            _close(caller)
            return
        server = socket.create_connection(("127.0.0.1", self.upstream_port))
        threading.Thread(target=_pump, args=(caller, server), daemon=True).start()
        if failing:
            server.recv(1)  # the server has handled the request and starts answering
            if self.failure == "stall":
                time.sleep(self.stall)
        else:
            _pump(server, caller)
        _close(caller)
        _close(server)


class SwitchableRelay:
    """A TCP relay to `upstream_host`:`upstream_port` that can be cut and restored: cut, every
    connection through it is closed at once and each new one closed as it comes, as the servers
    behind a database see a failover (or a restarted pooler) from their side; the database itself
    is untouched."""

    def __init__(self, upstream_host, upstream_port):
        self.upstream = (upstream_host, upstream_port)
        self.up = True
        self.connections = 0  # accepted while up
        self._open = set()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=_serve, args=(self.listener, self._accepted), daemon=True).start()

    def cut(self):
        with self._lock:
            self.up = False
            ends, self._open = self._open, set()
        for end in ends:
            _close(end)

    def restore(self):
        with self._lock:
            self.up = True

    def close(self):
        self.listener.close()
        self.cut()

    def _accepted(self, caller):
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            _close(caller)
            return
        with self._lock:
            relayed = self.up
            if relayed:
                self.connections += 1
                self._open |= {caller, server}
        if not relayed:
            _close(caller)
            _close(server)
            return
        threading.Thread(target=_pump, args=(caller, server), daemon=True).start()
        threading.Thread(target=_pump, args=(server, caller), daemon=True).start()


def _serve(listener, accepted):
    """Hand each connection `listener` accepts to `accepted`, until the listener is closed."""
    while True:
        try:
            caller, _ = listener.accept()
        except OSError:
            return
        accepted(caller)


def _pump(source, sink):
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the other side closed


def _close(end):
    try:
        end.shutdown(socket.SHUT_RDWR)  # wakes a pump blocked reading it
    except OSError:
        pass
    end.close()
