"""The warehouse as a DuckLake: a catalog in PostgreSQL, Parquet files in a folder or S3. No Dagster here.

``WANDB_ASSETS_DUCKDB=ducklake:postgres:<libpq conninfo>`` selects it. The ``ducklake``, ``postgres`` and
``httpfs`` extensions come from the ``duckdb-extension-*`` wheels pinned with duckdb (never downloaded):
DuckDB looks for ``<dir>/v<version>/<platform>/<name>.duckdb_extension``, so a private folder of symbolic
links to the wheels' files is made once per machine and version.
"""

from __future__ import annotations

import functools
import importlib
import os
import random
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import duckdb

from wandb_assets.lib.sql import sql_string

LAKE_PREFIX = "ducklake:"
#: The catalogs we support: PostgreSQL (through the postgres extension).
CATALOG_PREFIX = "ducklake:postgres:"

#: Python package -> the extension name DuckDB loads it by.
_EXTENSIONS = {"ducklake": "ducklake", "postgres": "postgres_scanner", "httpfs": "httpfs"}

#: Conflict retries of one write (DuckLake's optimistic commits); waits double from the first.
CONFLICT_ATTEMPTS = 6
CONFLICT_FIRST_WAIT_S = 0.2

T = TypeVar("T")


@dataclass(frozen=True)
class S3Options:
    """Object storage for the lake's files: the standard ``AWS_*`` settings, passed in (never read here)."""

    key_id: str | None = None
    secret: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    endpoint_url: str | None = None  # e.g. http://127.0.0.1:9000 (MinIO, moto); None = AWS


@dataclass(frozen=True)
class Lake:
    """Where a DuckLake warehouse lives. ``catalog`` is the libpq conninfo; its password is never in it."""

    catalog: str
    data_path: str | None = None
    s3: S3Options | None = None

    def __str__(self) -> str:  # printed in CLI output, errors and metadata: never a password, whatever got in
        return redact(f"{CATALOG_PREFIX}{self.catalog}")


class LakeMissingError(RuntimeError):
    """A reader attached a catalog that holds no lake yet (nothing was written)."""


def is_lake(location: object) -> bool:
    return isinstance(location, Lake) or str(location).startswith(LAKE_PREFIX)


def warehouse_name(location) -> str:
    """How an instance and its runs name a warehouse: a file's absolute path, a lake's catalog (never a password)."""
    from pathlib import Path

    return str(location) if is_lake(location) else str(Path(location).absolute())


def parse_catalog(value: str) -> str:
    """The conninfo of ``ducklake:postgres:<conninfo>``; ``ValueError`` (one sentence) for anything else."""
    if not value.startswith(CATALOG_PREFIX):
        raise ValueError(
            f"a DuckLake warehouse must be ducklake:postgres:<libpq conninfo> (got {redact(value)!r}): "
            "only a PostgreSQL catalog is supported"
        )
    conninfo = value[len(CATALOG_PREFIX) :].strip()
    if not conninfo:
        raise ValueError("ducklake:postgres: needs a libpq conninfo, e.g. 'host=db port=5432 dbname=lake user=lake'")
    from psycopg2.extensions import parse_dsn  # libpq's own parser: key=value, URIs and their ?query alike

    try:
        keys = parse_dsn(conninfo)
    except Exception:  # noqa: BLE001 - libpq's message may quote the conninfo, password and all
        raise ValueError(
            "the DuckLake catalog is not a valid libpq conninfo: use 'host=... port=... dbname=... user=...' or a "
            "postgresql:// URI"
        ) from None
    if {"password", "sslpassword"} & set(keys):
        raise ValueError(
            "the DuckLake catalog conninfo must not hold the password: set PGPASSWORD (libpq reads it) instead"
        )
    return conninfo


def redact(text: str) -> str:
    """``text`` without any ``password=...`` (``sslpassword=``, ``?password=`` too), ``user:password@`` or S3
    secret option it may carry (error messages, logs)."""
    text = re.sub(r"(password\s*=\s*)('[^']*'|[^\s&]+)", r"\1***", text, flags=re.I)
    text = re.sub(r"((?:KEY_ID|SECRET|SESSION_TOKEN)\s+)'(?:[^']|'')*'", r"\1'***'", text)  # the S3 secret statement
    return re.sub(r"(://[^/:@\s]*:)[^/@\s]*@", r"\1***@", text)


@functools.cache
def extension_directory() -> str:
    """A DuckDB extension directory whose entries are the pinned wheels' extension files."""
    version = duckdb.__version__
    platform = duckdb.execute("PRAGMA platform").fetchone()[0]
    root = Path(tempfile.gettempdir()) / f"wandb-assets-duckdb-extensions-{version}-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    owner = root.lstat()
    if root.is_symlink() or owner.st_uid != os.getuid() or owner.st_mode & 0o022:
        # another local user made it first (the path is predictable): they could swap the links we make in it
        raise RuntimeError(f"{root} is not this user's private folder: remove it (DuckDB extensions load from it)")
    folder = root / f"v{version}" / platform
    folder.mkdir(parents=True, exist_ok=True)
    for package, name in _EXTENSIONS.items():
        module = importlib.import_module(f"duckdb_extension_{package}")
        found = sorted(Path(module.__file__).parent.glob(f"extensions/v{version}/*.duckdb_extension"))
        if not found:
            raise RuntimeError(
                f"duckdb-extension-{package} holds no extension for duckdb {version}: pin both to the same version"
            )
        link = folder / f"{name}.duckdb_extension"
        if not link.exists() or link.resolve() != found[0].resolve():
            partial = folder / f".{name}.{random.getrandbits(32):x}"
            partial.symlink_to(found[0])
            partial.replace(link)
    return str(root)


# Extensions DuckDB has loaded in this process with its signature check (see ``connect``).
_VERIFIED: set[str] = set()


def _extension_names(s3: S3Options | None) -> tuple[str, ...]:
    return ("postgres", "ducklake") + (("httpfs",) if s3 else ())


def load_extensions(con, s3: S3Options | None) -> None:
    """Load the lake's extensions from the wheels into ``con`` and, for S3 data, one S3 secret."""
    con.execute(f"SET extension_directory = {sql_string(extension_directory())}")
    con.execute("SET autoinstall_known_extensions = false")
    checked = not con.execute("SELECT current_setting('allow_unsigned_extensions')").fetchone()[0]
    for name in _extension_names(s3):
        con.execute(f"LOAD {name}")
        if checked:
            _VERIFIED.add(name)
    if s3 is not None:
        options = {"REGION": s3.region}
        if s3.key_id:
            options |= {"KEY_ID": s3.key_id, "SECRET": s3.secret or ""}
        if s3.session_token:
            options["SESSION_TOKEN"] = s3.session_token
        use_ssl = True
        if s3.endpoint_url:
            endpoint = s3.endpoint_url.rstrip("/")
            use_ssl = not endpoint.startswith("http://")
            options |= {"ENDPOINT": re.sub(r"^https?://", "", endpoint), "URL_STYLE": "path"}
        settings = ", ".join(f"{key} {sql_string(value)}" for key, value in options.items())
        con.execute(f"CREATE OR REPLACE TEMPORARY SECRET wandb_assets_s3 (TYPE s3, {settings}, USE_SSL {use_ssl})")


def connection_config(s3: S3Options | None) -> dict[str, str | bool]:
    """DuckDB settings of a lake connection.

    DuckDB checks an extension's signature on every LOAD by hashing the whole file (41 MB for postgres): ~0.2 s
    per connection, and a lake tick opens dozens. The first connection of the process loads the extensions with
    the check; later ones load the same files (links in this user's private folder to the pinned wheels) without.
    """
    verified = all(name in _VERIFIED for name in _extension_names(s3))
    return {"custom_user_agent": "wandb-assets"} | ({"allow_unsigned_extensions": True} if verified else {})


def attach(con, lake: Lake, alias: str, read_only: bool) -> None:
    """Attach the lake to ``con`` as ``alias`` (extensions loaded first). Errors never show a password."""
    options = ["READ_ONLY"] if read_only else []
    if lake.data_path and not read_only:
        options.append(f"DATA_PATH {sql_string(lake.data_path)}")
    clause = f" ({', '.join(options)})" if options else ""
    try:
        load_extensions(con, lake.s3)  # inside: a failing S3 secret statement's error quotes the key
        con.execute(f"ATTACH {sql_string(CATALOG_PREFIX + lake.catalog)} AS {alias}{clause}")
    except duckdb.Error as exc:
        first_line = redact(str(exc)).splitlines()[0]
        if read_only and "does not exist" in first_line:
            raise LakeMissingError(
                f"There is no DuckLake at {lake} yet: the first backfill creates it (`uv run wandb-assets backfill`)."
            ) from None
        raise RuntimeError(f"The DuckLake warehouse {lake} could not be attached: {first_line}") from None


def connect(lake: Lake, read_only: bool = False):
    """A private in-memory DuckDB with the lake attached as ``warehouse`` and in use, clock in UTC."""
    con = duckdb.connect(":memory:", config=connection_config(lake.s3))
    try:
        attach(con, lake, "warehouse", read_only)
        con.execute("USE warehouse")
        con.execute("SET TimeZone = 'UTC'")
    except BaseException:
        con.close()
        raise
    return con


def in_lake(con) -> bool:
    """Whether ``con``'s current database is a DuckLake (its rules differ: no sequences, no view-column comments)."""
    row = con.execute("SELECT type FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return bool(row) and row[0] == "ducklake"


def current_snapshot_id(con) -> int | None:
    """The lake's latest committed snapshot (what a reader attaching now sees), or None outside a lake."""
    if not in_lake(con):
        return None
    return con.execute("SELECT max(snapshot_id) FROM ducklake_snapshots(current_database())").fetchone()[0]


def is_conflict(exc: BaseException) -> bool:
    """DuckLake's answer when another transaction committed a clashing change first."""
    return isinstance(exc, duckdb.TransactionException) and "conflict" in str(exc).lower()


def retry_on_conflict(
    write: Callable[..., T], attempts: int = CONFLICT_ATTEMPTS, first_wait_s: float = CONFLICT_FIRST_WAIT_S
) -> Callable[..., T]:
    """``write`` again, with doubling jittered waits, when its commit lost a DuckLake conflict. ``write`` must be
    one whole transaction (it re-reads what it depends on); the failed commit has already rolled back."""

    @functools.wraps(write)
    def retried(*args, **kwargs) -> T:
        wait = first_wait_s
        for attempt in range(1, attempts + 1):
            try:
                return write(*args, **kwargs)
            except duckdb.TransactionException as exc:
                if not is_conflict(exc) or attempt == attempts:
                    raise
            time.sleep(wait * (1 + random.random()))
            wait *= 2
        raise AssertionError("unreachable")

    return retried
