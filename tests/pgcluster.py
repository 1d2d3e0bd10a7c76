"""A throwaway PostgreSQL server for tests: ``initdb`` in a temporary folder, a server listening only on a
unix socket in that folder, stopped and removed afterwards.

Debian's ``postgresql`` package (``make setup`` installs it) keeps the server programs in
/usr/lib/postgresql/<version>/bin, off PATH. PostgreSQL refuses to run as root, and CI runs as root:
then the server runs as the ``postgres`` system user the package creates (``runuser -u postgres``),
in a folder handed to that user. The test process (root) can still reach the socket.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PORT = 5432  # only names the socket file (.s.PGSQL.5432) inside a folder of our own; no TCP port is opened


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here; the message says why."""


def find_bindir() -> Path:
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    raise PostgresUnavailable(
        "PostgreSQL's server programs (initdb, pg_ctl) are not installed: Debian's postgresql package provides "
        "them (make setup installs it)"
    )


def _run_as() -> tuple[list[str], int, int]:
    """The command prefix that runs the server as a user PostgreSQL accepts, and that user's uid/gid."""
    if os.geteuid() != 0:
        return [], os.getuid(), os.getgid()
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, and PostgreSQL refuses to run as root; there is no 'postgres' user to run it as "
            "(Debian's postgresql package creates one)"
        ) from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise PostgresUnavailable(
            "running as root, and `runuser` (util-linux) is missing to start PostgreSQL as the postgres user"
        )
    return [runuser, "-u", "postgres", "--"], user.pw_uid, user.pw_gid


@dataclass
class PgCluster:
    root: Path  # data directory, log and socket live here
    bindir: Path
    run_as: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.root}&port={PORT}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        subprocess.run(
            [str(self.bindir / "createdb"), "-h", str(self.root), "-p", str(PORT), "-U", "postgres", name],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return self.url(name)

    def start_command(self) -> list[str]:
        return [
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
            "-o", f"-c listen_addresses='' -c unix_socket_directories='{self.root}' -c port={PORT} -c fsync=off",
            "start",
        ]  # fmt: skip

    def halt(self) -> None:
        """Stop the server as a crash would (no shutdown checkpoint), keeping its data for `resume`."""
        subprocess.run(
            [*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )

    def resume(self) -> None:
        """Start the halted server again on the same data (it recovers from its WAL)."""
        subprocess.run([*self.run_as, *self.start_command()], check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


def start() -> PgCluster:
    """Start a fresh cluster, or raise PostgresUnavailable saying why it could not start."""
    bindir = find_bindir()
    run_as, uid, gid = _run_as()
    # mkdtemp makes a 0700 folder; hand it to the server's user (its socket lives here too). /tmp rather than
    # $TMPDIR: the postgres user must be able to reach it, and a socket path may not exceed 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="sleuthd-pg-", dir="/tmp" if Path("/tmp").is_dir() else None))
    os.chown(root, uid, gid)
    cluster = PgCluster(root, bindir, run_as)
    steps = [
        # trust: only local socket connections exist, in a folder nobody else can enter.
        # --no-sync and fsync=off: a throwaway cluster; the durability under test is the client's transactions.
        [str(bindir / "initdb"), "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
        cluster.start_command(),
    ]
    for step in steps:
        done = subprocess.run([*run_as, *step], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
            cluster.stop()
            raise PostgresUnavailable(
                f"`{Path(step[0]).name}` failed (exit {done.returncode}): {done.stderr.strip()[-800:]} {log[-800:]}"
            )
    return cluster
