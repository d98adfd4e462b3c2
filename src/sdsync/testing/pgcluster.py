"""A throwaway PostgreSQL cluster for tests and benchmarks.

Theory of operation
-------------------
``initdb`` a cluster in a temporary directory, start it with ``pg_ctl`` listening on
127.0.0.1 only, on a free port, with its socket in the same directory, and remove
everything on :meth:`TempCluster.stop`.  Durability is switched off (``fsync=off``):
the cluster dies with the run anyway.  PostgreSQL refuses to run as root, so as root
the server runs as the ``postgres`` system user (``runuser``) and the directory is
handed to it.  The binaries are found on ``PATH`` or in Debian's
``/usr/lib/postgresql/<version>/bin``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"


class PostgresUnavailableError(RuntimeError):
    """PostgreSQL binaries are missing or the server would not start."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).resolve().parent
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    raise PostgresUnavailableError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found; "
        "install them with: apt-get install postgresql"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TempCluster:
    directory: Path
    port: int
    bin_dir: Path
    as_user: str | None

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def stop(self) -> None:
        _run(self, "pg_ctl", "-D", str(self.directory / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)


def start_cluster() -> TempCluster:
    """initdb and start a cluster; raises :class:`PostgresUnavailableError`."""
    bin_dir = find_bin_dir()
    as_user = SERVER_USER if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="sdsync-pg-"))
    if as_user is not None:
        try:
            user = pwd.getpwnam(as_user)
        except KeyError:
            raise PostgresUnavailableError(f"running as root needs a '{as_user}' user") from None
        os.chown(directory, user.pw_uid, user.pw_gid)
    cluster = TempCluster(directory, free_port(), bin_dir, as_user)
    data = str(directory / "data")
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={cluster.port} "
        f"-c unix_socket_directories={directory} -c fsync=off -c synchronous_commit=off "
        "-c full_page_writes=off -c max_connections=100 -c shared_buffers=128MB"
    )
    try:
        _run(cluster, "initdb", "-D", data, "-U", SERVER_USER, "--auth=trust", "-E", "UTF8")
        _run(cluster, "pg_ctl", "-D", data, "-o", options, "-l", f"{directory}/log", "-w", "start")
    except PostgresUnavailableError:
        log = directory / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        shutil.rmtree(directory, ignore_errors=True)
        raise PostgresUnavailableError(f"PostgreSQL did not start:\n{tail}") from None
    return cluster


def _run(cluster: TempCluster, program: str, *args: str) -> None:
    command = [str(cluster.bin_dir / program), *args]
    if cluster.as_user is not None:
        command = ["runuser", "-u", cluster.as_user, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise PostgresUnavailableError(
            f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )
