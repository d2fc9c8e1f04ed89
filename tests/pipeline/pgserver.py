"""A throw-away PostgreSQL server for the ledger tests: loopback, ephemeral port, temp data dir.

Uses the server binaries of the distribution's ``postgresql`` package (``make test`` installs it
with apt-get when missing; see the Makefile's ``pg-server`` target). PostgreSQL refuses to run as
root, so under root the server runs as the package's ``postgres`` user (the data directory is
made theirs). The superuser ``dpq`` gets a random password and password authentication
(scram-sha-256) on 127.0.0.1, so the tests pass credentials the way production does: through
``PGPASSWORD`` or a password file, never in the URL.

Anything that stops the server from starting raises :class:`PostgresUnavailable` with the reason;
the fixture turns it into a test failure, never a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time


class PostgresUnavailable(RuntimeError):
    """The test server could not be started (the message says why and how to fix it)."""


def find_bindir() -> str:
    """The directory of ``initdb`` and ``postgres`` (newest Debian version first)."""
    env = os.environ.get("DPQ_PG_BINDIR")
    candidates = ([env] if env else []) + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True)
    for d in candidates:
        if os.path.exists(os.path.join(d, "initdb")) and os.path.exists(os.path.join(d, "postgres")):
            return d
    which = shutil.which("initdb")
    if which and shutil.which("postgres"):
        return os.path.dirname(os.path.realpath(which))
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, postgres) found: run `make pg-server` (as root: "
        "apt-get install -y postgresql) or set DPQ_PG_BINDIR")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """Start with :meth:`start`, stop with :meth:`stop`; ``url`` has no password."""

    user = "dpq"
    database = "postgres"

    def __init__(self):
        self.bindir = find_bindir()
        self.password = secrets.token_urlsafe(18)
        self.dir = tempfile.mkdtemp(prefix="dpq-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        self._run_as = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable(
                    "running as root, and PostgreSQL refuses root: no `postgres` user to run "
                    "the test server as (the Debian postgresql package creates it)") from None
            self._run_as = (pw.pw_uid, pw.pw_gid)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o700)

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _demote(self):
        if self._run_as is not None:
            uid, gid = self._run_as
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    def start(self, timeout: float = 60.0) -> "PostgresServer":
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as fh:
            fh.write(self.password + "\n")
        if self._run_as:
            os.chown(pwfile, *self._run_as)
        init = subprocess.run(
            [os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", self.user,
             f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"
             if os.path.exists("/usr/lib/locale/C.utf8") else "--no-locale"],
            capture_output=True, text=True, preexec_fn=self._demote, timeout=120)
        os.remove(pwfile)
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
        log = open(os.path.join(self.dir, "server.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(self.bindir, "postgres"), "-D", self.data, "-h", "127.0.0.1",
             "-p", str(self.port), "-k", self.dir, "-c", "max_connections=60",
             "-c", "fsync=off", "-c", "shared_buffers=16MB"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._demote)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresUnavailable(f"postgres exited with {self.proc.returncode}: "
                                          f"{self.log()[-2000:]}")
            ready = subprocess.run([os.path.join(self.bindir, "pg_isready"), "-h", "127.0.0.1",
                                    "-p", str(self.port), "-t", "2"], capture_output=True)
            if ready.returncode == 0:
                return self
            time.sleep(0.2)
        self.stop()
        raise PostgresUnavailable(f"postgres did not accept connections within {timeout:g} s: "
                                  f"{self.log()[-2000:]}")

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "server.log")) as fh:
                return fh.read()
        except OSError:
            return ""

    def env(self) -> dict:
        """Environment for a client process: the password via libpq's PGPASSWORD."""
        return {**os.environ, "PGPASSWORD": self.password}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown; then fast if clients linger
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(2)
                self.proc.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)
