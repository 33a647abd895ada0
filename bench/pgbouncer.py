"""A PgBouncer in transaction pooling mode in front of the local PostgreSQL, for the tests
(tests/pooler/) and `make bench --pooler` alike: Debian's `pgbouncer` (`make install`) on a
free port of 127.0.0.1 with a generated ini, every database name passed through to
127.0.0.1:5432, trust authentication.

Transaction pooling is what breaks a client that keeps state on its server connection: a
prepared statement, a holdable cursor or a session's advisory lock is on one server
connection, and the client's next transaction may be given another. The pool holds fewer
server connections than the stack opens client connections, so transactions of different
clients really do share them. PgBouncer 1.21 and later can keep prepared statements for
its clients; `max_prepared_statements = 0` switches that off, so nothing passes here that
relies on it (1.18, Debian 12's, has no such feature and refuses the setting).

PgBouncer refuses to run as root; as root it is started with `-u nobody`.
"""

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from .stack import free_port

SERVER_CONNECTIONS = 10  # per database, by default: fewer than the test stack's client connections


def _version(binary):
    """(major, minor) of `pgbouncer --version` ("PgBouncer 1.18.0")."""
    found = re.search(r"PgBouncer (\d+)\.(\d+)", subprocess.run([binary, "--version"], capture_output=True,
                                                                 text=True).stdout)
    return (int(found[1]), int(found[2])) if found else (0, 0)


class PgBouncer:
    """`with PgBouncer() as bouncer:` a running PgBouncer; `bouncer.url(name)` reaches database
    `name` through it. Its ini and log are in a temporary folder, removed when it stops."""

    def __init__(self, server_host="127.0.0.1", server_port=5432, pool_size=SERVER_CONNECTIONS):
        self.server_host, self.server_port, self.pool_size = server_host, server_port, pool_size
        self.port = free_port()
        self.process = None
        self.folder = None

    def url(self, name):
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _ini(self, binary):
        lines = [
            "[databases]",
            f"* = host={self.server_host} port={self.server_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.folder}/users.txt",
            "pool_mode = transaction",
            "admin_users = postgres",  # its console (database `pgbouncer`): SHOW SERVERS, SHOW POOLS
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 1000",
            f"logfile = {self.folder}/pgbouncer.log",
            "log_connections = 0",
            "log_disconnections = 0",
        ]
        if _version(binary) >= (1, 21):
            lines.append("max_prepared_statements = 0")
        return "\n".join(lines) + "\n"

    def start(self):
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed (make install: apt-get install -y pgbouncer)")
        self.folder = Path(tempfile.mkdtemp(prefix="surety-pgbouncer-"))
        (self.folder / "users.txt").write_text('"postgres" ""\n')
        (self.folder / "pgbouncer.ini").write_text(self._ini(binary))
        argv = [binary, str(self.folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            self.folder.chmod(0o777)  # the log is written as `nobody`
            argv[1:1] = ["-u", "nobody"]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        start_new_session=True)
        deadline, failure = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.process.stderr.read().decode()}")
            try:  # its console answers without a server connection, whatever PostgreSQL's load
                self._console("SHOW VERSION")
                return self
            except psycopg.OperationalError as error:
                failure = error
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not answer within 10 s: {failure}")

    def _console(self, command):
        """Rows of one of PgBouncer's console commands, as dicts (it speaks the simple protocol only)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor,
                             connect_timeout=2) as console:
            cursor = console.execute(command)
            columns = [d.name for d in cursor.description]
            return [dict(zip(columns, row)) for row in cursor]

    def server_pids(self, database):
        """The PostgreSQL backends of PgBouncer's server connections to `database` (its console)."""
        return {row["remote_pid"] for row in self._console("SHOW SERVERS") if row["database"] == database}

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process is not None:
            self.process.stderr.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
