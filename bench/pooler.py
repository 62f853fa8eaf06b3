"""PgBouncer in front of a PostgreSQL server, started for the benchmarks and the tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time


class Pooler:
    """A PgBouncer process in front of the PostgreSQL server at ``host``:``port``, on a free
    local port, in ``mode`` (``transaction``, ``session`` or ``statement``), pooling at most
    ``pool_size`` server connections per database and user, for ``users`` (trusted, as the
    server trusts them). Debian's package; as root it runs as the ``postgres`` user
    (PgBouncer refuses to run as root). ``extra`` is more of its settings (later lines win).
    """

    def __init__(self, mode: str, *, host: str = "127.0.0.1", port: int = 5432,
                 users: tuple[str, ...] = ("postgres",), pool_size: int = 20,
                 max_clients: int = 1000, extra: str = "") -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not os.path.exists(binary):
            raise RuntimeError("PgBouncer is not installed (apt-get install pgbouncer)")
        self.dir = tempfile.mkdtemp(prefix="cogency-pgbouncer-")
        os.chmod(self.dir, 0o755)
        auth_file = os.path.join(self.dir, "users.txt")
        with open(auth_file, "w") as out:
            out.write("".join(f'"{user}" ""\n' for user in users))
        said = ""
        for _ in range(5):
            with socket.socket() as probe:  # a free port (another process may take it first)
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            config = os.path.join(self.dir, "pgbouncer.ini")
            with open(config, "w") as out:
                out.write(
                    "[databases]\n"
                    f"* = host={host} port={port}\n"
                    "[pgbouncer]\n"
                    f"pool_mode = {mode}\n"
                    f"default_pool_size = {pool_size}\nmax_client_conn = {max_clients}\n"
                    "autodb_idle_timeout = 10\nserver_login_retry = 1\n"
                    + extra
                    + f"\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
                    "unix_socket_dir =\nlogfile =\npidfile =\n"
                    f"auth_type = trust\nauth_file = {auth_file}\n"
                )
            for path in (auth_file, config):
                os.chmod(path, 0o644)
            command = [binary, config]
            if os.geteuid() == 0:
                command[1:1] = ["-u", "postgres"]
            self.log = open(os.path.join(self.dir, "pgbouncer.log"), "w+")
            self.process = subprocess.Popen(command, stdout=self.log, stderr=self.log)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.process.poll() is None:
                with socket.socket() as client:
                    if client.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
                time.sleep(0.05)
            self.log.seek(0)
            said = self.log.read()[-2000:]
            self.stop()
        raise RuntimeError(f"PgBouncer did not start: {said}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
