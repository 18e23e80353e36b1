"""A throwaway PostgreSQL 15 server on loopback: the tests' (``conftest.postgres``) and the DuckLake benchmark's."""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb): .ci/run installs it")
    return Path(found[-1]).parent


def _as_postgres(command: list[str]) -> list[str]:
    """initdb and pg_ctl refuse to run as root: run them as the ``postgres`` user when we are root."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def running_postgres(password: str, databases: tuple[str, ...] = ("dagster",)) -> Iterator[dict]:
    """``initdb`` as the ``postgres`` user into a temporary folder, ``pg_ctl`` on a free loopback port (password auth
    over TCP, ``password``), ``databases`` created; yields where it listens; stopped and removed at the end."""
    import psycopg2

    bin_dir = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="wandb-assets-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run(
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
            ]
        ),
        **run,
    )
    for attempt in range(5):  # a free port can be taken by another worker's server before postgres binds it
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
        start = [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]
        try:
            subprocess.run(_as_postgres(start), **run)
            break
        except subprocess.CalledProcessError:
            log = (root / "log").read_text(errors="replace") if (root / "log").exists() else ""
            if attempt == 4 or "Address already in use" not in "\n".join(log.splitlines()[-6:]):
                raise
            port = free_port()
    try:
        local = psycopg2.connect(host=str(root), port=port, user="postgres", dbname="postgres")
        local.autocommit = True
        with local.cursor() as cursor:
            cursor.execute("ALTER USER postgres PASSWORD %s", (password,))
            for name in databases:
                cursor.execute(f'CREATE DATABASE "{name}"')
        local.close()
        yield {"host": "127.0.0.1", "port": port, "user": "postgres", "password": password, "db": databases[0]}
    finally:
        subprocess.run(_as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), **run)
        shutil.rmtree(root, ignore_errors=True)
