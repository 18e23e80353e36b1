"""Offline W&B run logs (``wandb/offline-run-*/run-<id>.wandb``) read straight into ``runs`` rows.

A ``.wandb`` file is a 7-byte header (``:W&B``, 0xBEE1 little-endian, version 0) and a LevelDB-style log of
32 KiB blocks. Each chunk has a 7-byte header: CRC-32 (IEEE, seeded with the chunk type byte), length
(uint16 LE), type (FULL=1, FIRST=2, MIDDLE=3, LAST=4); a record longer than the room left in a block is
split FIRST/MIDDLE.../LAST, and fewer than 7 bytes left at a block's end are zero padding. Payloads are
``wandb_internal_pb2.Record`` protobufs (the installed wandb's own definitions). The framing has not changed
since wandb 0.10 (Python's ``datastore.py`` then, wandb-core's Go ``leveldb`` writer with the IEEE CRC now);
the records have gained fields (``nested_key``, history ``step``, ``environment`` ...) which older logs simply
lack, and protobuf skips fields it does not know.

Damage never aborts a run: a chunk whose CRC does not match, or whose header is impossible, loses the rest
of its 32 KiB block (reading resumes at the next block, as LevelDB's reader does); a file cut mid-record
keeps every record before the cut. Both are counted in ``OfflineRun.damage``.

Speed: a 10,000-step run written by wandb-core is ~30,000 records and ~220,000 history/summary items (each
history row is followed by a summary update mirroring it), and only each key's last value is kept. The native
reader (``_wandb_log.c``, built by setup.py) frames, checks CRCs and folds every item in one C pass, ~20 ms a
log; protobuf parses only the few other records. Without a C compiler the Python reader does the same (frame
in a loop, one C-level protobuf parse of every record, fold in Python) in ~190 ms; ``reader()`` says which is
in use, and tests/test_offline_runs.py checks both give the same run from every test log and hundreds of
damaged copies.

Nothing here imports Dagster or reads the environment.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from wandb_assets.lib.accounting.gpus import METADATA_MAX_BYTES, machine_metadata
from wandb_assets.lib.fetch import METADATA_FILE
from wandb_assets.lib.normalize import ENDED_STATES
from wandb_assets.lib.projects import ProjectSelection

BLOCK = 32 * 1024
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_SEEDS = {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}
#: File name of a run's log inside its run directory.
LOG_GLOB = "*.wandb"


@dataclass(frozen=True)
class Damage:
    """One damaged stretch of a log: ``kind`` is ``corrupt`` (bad CRC or chunk header; the rest of the block
    was skipped), ``truncated`` (the file ends mid-record), ``bad_header`` or ``unparsable`` (a record that
    is not a protobuf); ``offset`` is the byte where it starts."""

    kind: str
    offset: int
    detail: str


@dataclass
class OfflineRun:
    """What one offline log says about its run (values decoded from their JSON)."""

    path: str
    run_id: str = ""
    entity: str = ""
    project: str = ""
    display_name: str = ""
    tags: list[str] = field(default_factory=list)
    group: str = ""
    job_type: str = ""
    sweep_id: str = ""
    cli_version: str = ""
    created_at: datetime | None = None
    last_record_at: datetime | None = None
    exit_code: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    records: int = 0
    history_items: int = 0
    damage: list[Damage] = field(default_factory=list)
    #: The GPU part of each system-stats record, in log order: (unix seconds, ``{"system.gpu.<i>.<what>": value}``),
    #: the keys as the runs query's ``systemMetrics`` names them (the log's stats items lack the ``system.`` prefix).
    gpu_stats: list[tuple[float, dict[str, float]]] = field(default_factory=list)


def find_run_logs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Every ``.wandb`` file under ``paths`` (a file, a run directory or any folder, searched recursively),
    sorted and without duplicates; and the paths that do not exist. Only regular files: a FIFO, a device or a
    link leading out of the folder searched is never opened (anyone who can write to a shared tree could make one,
    and a FIFO would hang the job while it holds the warehouse)."""
    found: set[Path] = set()
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.add(path.resolve())
        elif path.is_dir():
            root = path.resolve()
            for candidate in path.rglob(LOG_GLOB):
                resolved = candidate.resolve()
                if resolved.is_relative_to(root) and _is_regular(resolved):
                    found.add(resolved)
        else:
            missing.append(str(raw))
    return sorted(found), missing


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_regular_file(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of ``path`` (``limit`` at most), opened without blocking and without following a last link, and
    read only if it is a regular file: an ``OSError`` otherwise (a FIFO or a device never blocks the reader)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read() if limit is None else handle.read(limit)
    finally:
        os.close(fd)


def file_states(files: Iterable[Path]) -> dict[str, tuple[int, int]]:
    """``{path: (size, mtime_ns)}``: what tells a new or grown log from one already read."""
    states = {}
    for path in files:
        try:
            info = path.stat()
        except OSError:
            continue
        states[str(path)] = (info.st_size, info.st_mtime_ns)
    return states


#: Framing damage codes, the same in ``_wandb_log.c`` (which returns codes), and their kind and detail text.
IMPOSSIBLE, CUT, CRC, ORPHAN, CUT_SPLIT, STRAY = range(1, 7)
FRAMING_DAMAGE = {
    IMPOSSIBLE: ("corrupt", "impossible chunk header (type {a}, length {b})"),
    CUT: ("truncated", "file ends {a} bytes into a record"),
    CRC: ("corrupt", "CRC mismatch; the rest of the block was skipped"),
    ORPHAN: ("corrupt", "a record missing its last chunk"),
    CUT_SPLIT: ("truncated", "file ends inside a record split over blocks"),
    STRAY: ("truncated", "{a} stray bytes after the last record"),
}
UNPARSABLE = "a record that is not a protobuf"


def _damage(code: int, offset: int, a: int = 0, b: int = 0) -> Damage:
    kind, text = FRAMING_DAMAGE[code]
    return Damage(kind, offset, text.format(a=a, b=b))


def _start(data: bytes) -> tuple[int | None, list[Damage]]:
    """Where the records start (after the file header), or None for a file that is not a ``.wandb`` log."""
    if not data.startswith(HEADER[:4]):
        if not _valid_chunk_at(data, 0):
            return None, [Damage("bad_header", 0, "not a .wandb file (no :W&B header, no valid first record)")]
        return 0, []  # the earliest 0.10 pre-releases wrote no file header: the log starts at byte 0
    if data[4:7] != HEADER[4:7]:
        return len(HEADER), [Damage("bad_header", 4, f"unknown header magic/version {data[4:7].hex()}; read anyway")]
    return len(HEADER), []


def read_frames(data: bytes) -> tuple[list[memoryview], list[Damage]]:
    """The record payloads (views into ``data``) of a ``.wandb`` file's bytes, in order, and the damage met on
    the way. (The native reader, ``_wandb_log.scan``, frames exactly so; this is its reference.)"""
    start, damage = _start(data)
    if start is None:
        return [], damage
    payloads: list = []
    append = payloads.append
    unpack, crc32, seeds = struct.unpack_from, zlib.crc32, _SEEDS
    offset, size, pending, pending_at, truncated = start, len(data), None, 0, False
    view = memoryview(data)
    while offset + 7 <= size:
        room = BLOCK - offset % BLOCK
        if room < 7:  # block trailer
            offset += room
            continue
        checksum, length, kind = unpack("<IHB", data, offset)
        end = offset + 7 + length
        if kind not in seeds or length > room - 7:
            if checksum == 0 and length == 0 and kind == 0 and not any(data[offset : offset + room]):
                offset += room  # zero-filled rest of a block (a preallocated or synced-but-unwritten tail)
                continue
            damage.append(_damage(IMPOSSIBLE, offset, kind, length))
            offset += room
            pending = None
            continue
        if end > size:
            damage.append(_damage(CUT, offset, end - size))
            pending, truncated = None, True
            break
        chunk = view[offset + 7 : end]  # no copy: the one join in _fold_in_python copies each payload once
        if crc32(chunk, seeds[kind]) != checksum:
            damage.append(_damage(CRC, offset))
            offset += room
            pending = None
            continue
        chunk_at, offset = offset, end
        if kind == FULL:
            if pending is not None:
                damage.append(_damage(ORPHAN, pending_at))
                pending = None
            append(chunk)
        elif kind == FIRST:
            pending, pending_at = [chunk], chunk_at
        elif pending is None:
            continue  # the middle or end of a record whose start was lost (already counted)
        else:
            pending.append(chunk)
            if kind == LAST:
                append(b"".join(pending))
                pending = None
    if pending is not None:
        damage.append(_damage(CUT_SPLIT, pending_at))
    elif offset < size and not truncated and any(data[offset:]):
        damage.append(_damage(STRAY, offset, size - offset))
    return payloads, damage


def _valid_chunk_at(data: bytes, offset: int) -> bool:
    if len(data) < offset + 7:
        return False
    checksum, length, kind = struct.unpack_from("<IHB", data, offset)
    chunk = data[offset + 7 : offset + 7 + length]
    return kind in _SEEDS and len(chunk) == length and zlib.crc32(chunk, _SEEDS[kind]) == checksum


def _decode(value_json: str) -> Any:
    try:
        return json.loads(value_json) if value_json else None
    except ValueError:
        return value_json  # not JSON: kept as the text it is


def _set(target: dict, path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = target[part] = {}
        target = child
    if path:
        target[path[-1]] = value


def _remove(target: dict, path: tuple[str, ...]) -> None:
    for part in path[:-1]:
        target = target.get(part)
        if not isinstance(target, dict):
            return
    if path:
        target.pop(path[-1], None)


def _fold(items) -> dict[str | tuple[str, ...], str]:
    """Last value (raw JSON) per key, over repeated ``update``/``item`` messages in log order. A key is the
    string itself (``key`` or a one-part ``nested_key``: W&B treats them alike) or the tuple of its parts."""
    folded: dict[str | tuple[str, ...], str] = {}
    for item in items:
        key = item.key
        if not key:
            parts = item.nested_key
            key = parts[0] if len(parts) == 1 else tuple(parts)
        folded[key] = item.value_json
    return folded


def _log_view():
    """A message type that parses a whole log's record payloads, concatenated, in one C-level call.

    Concatenated protobufs parse as their merge, but ``Record``'s oneof would keep only the last kind, so this
    type declares the members it needs as plain fields: ``history`` and ``summary`` merge (their items append
    in log order), the others are repeated (one entry per record, in order). Their types are wandb's own."""
    global _VIEW
    if _VIEW is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from wandb.proto import wandb_internal_pb2

        field = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(
            name="wandb_assets/offline_log_view.proto",
            package="wandb_assets_offline",
            syntax="proto3",
            dependency=[wandb_internal_pb2.DESCRIPTOR.name],
        )
        view = proto.message_type.add(name="LogView")
        optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
        for name, number, label, type_name in (
            ("history", 2, optional, "HistoryRecord"),
            ("summary", 3, optional, "SummaryRecord"),
            ("config", 5, repeated, "ConfigRecord"),
            ("stats", 7, repeated, "StatsRecord"),
            ("telemetry", 11, repeated, "TelemetryRecord"),
            ("run", 17, repeated, "RunRecord"),
            ("exit", 18, repeated, "RunExitRecord"),
        ):
            view.field.add(
                name=name, number=number, type=field.TYPE_MESSAGE, label=label, type_name=f".wandb_internal.{type_name}"
            )
        pool = descriptor_pool.Default()
        try:
            pool.FindFileByName(proto.name)
        except KeyError:
            pool.Add(proto)
        _VIEW = message_factory.GetMessageClass(pool.FindMessageTypeByName("wandb_assets_offline.LogView"))
    return _VIEW


_VIEW = None


def _time(seconds: float | None) -> datetime | None:
    if seconds is None or seconds != seconds or seconds <= 0:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None


@dataclass
class _Folded:
    """A log's records, read: every key's last history and summary value (raw JSON), the removed summary keys,
    and the parsed view of the other records (run, config, exit, telemetry, stats)."""

    records: int
    history_items: int
    history: dict[str | tuple[str, ...], str]
    summary: dict[str | tuple[str, ...], str]
    removed: Iterable[str | tuple[str, ...]]
    others: Any


def _fold_in_python(data: bytes, run: OfflineRun) -> _Folded:
    """The reference reader: frame in Python, parse every record in one C-level protobuf call, fold in Python."""
    payloads, run.damage = read_frames(data)
    full = _parse_log(b"".join(payloads), payloads, run)
    return _Folded(
        records=len(payloads),
        history_items=len(full.history.item),
        history=_fold(full.history.item),
        summary=_fold(full.summary.update),
        removed=_fold(full.summary.remove),
        others=full,
    )


def _key_of(key_id: bytes) -> str | tuple[str, ...]:
    """The key a native key id stands for (see ``_wandb_log.c``): a string, or the tuple of a nested key's parts."""
    if key_id[:1] == b"K":
        return key_id[1:].decode()
    parts, offset = [], 1
    while offset < len(key_id):
        (size,) = struct.unpack_from("<I", key_id, offset)
        parts.append(key_id[offset + 4 : offset + 4 + size].decode())
        offset += 4 + size
    return tuple(parts)


def _fold_natively(data: bytes, run: OfflineRun) -> _Folded:
    """The same in one C pass (``_wandb_log.scan``): framing, CRCs and the history/summary fold; protobuf parses
    only the few other records."""
    start, run.damage = _start(data)
    if start is None:
        return _Folded(0, 0, {}, {}, (), _log_view()())
    records, unparsable, history_items, history, summary, removed, others, framing = _native.scan(data, start)
    run.damage += [_damage(*entry) for entry in framing]
    run.damage += [Damage("unparsable", 0, UNPARSABLE)] * unparsable
    return _Folded(
        records=records,
        history_items=history_items,
        history={_key_of(k): v.decode() for k, v in history.items()},
        summary={_key_of(k): v.decode() for k, v in summary.items()},
        removed=[_key_of(k) for k in removed],
        others=_parse_log(b"".join(others), others, run),
    )


try:  # built by setup.py where a C compiler is (always in CI); without it the Python reader does the same, slower
    from wandb_assets.lib import _wandb_log as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None


def reader() -> str:
    """Which reader is in use: ``native`` (the C extension) or ``python``."""
    return "native" if _native is not None else "python"


def read_offline_run(path: str | os.PathLike) -> OfflineRun:
    """Read one ``.wandb`` file: the run's identity, config, final summary, exit and times. Never raises on a
    damaged log (see ``read_frames``); an unreadable file is a ``Damage`` too."""
    run = OfflineRun(path=str(path))
    try:
        data = read_regular_file(path)
    except OSError as exc:
        run.damage.append(Damage("unreadable", 0, f"{type(exc).__name__}: {exc.strerror or exc}"))
        return run
    log = _fold_natively(data, run) if _native is not None else _fold_in_python(data, run)
    run.records, run.history_items, full = log.records, log.history_items, log.others

    config: dict[str | tuple[str, ...], Any] = {}
    times: list[float] = []
    runtimes: list[float] = []
    start_seconds: float | None = None
    for r in full.run:
        run.run_id = r.run_id or run.run_id
        run.entity, run.project = r.entity or run.entity, r.project or run.project
        run.display_name = r.display_name or run.display_name
        run.tags = list(r.tags) or run.tags
        run.group, run.job_type = r.run_group or run.group, r.job_type or run.job_type
        run.sweep_id = r.sweep_id or run.sweep_id
        if r.HasField("start_time"):
            start_seconds = r.start_time.seconds + r.start_time.nanos / 1e9
        config.update(_fold(r.config.update))
        for key in _fold(r.config.remove):
            config.pop(key, None)
    for c in full.config:
        config.update(_fold(c.update))
        for key in _fold(c.remove):
            config.pop(key, None)
    for e in full.exit:
        run.exit_code = e.exit_code
        runtimes.append(e.runtime)
    for t in full.telemetry:
        run.cli_version = t.cli_version or run.cli_version
    for s in full.stats:
        if s.HasField("timestamp"):
            at = s.timestamp.seconds + s.timestamp.nanos / 1e9
            times.append(at)
            sample = {}
            for item in s.item:
                key = item.key if item.key.startswith("system.") else "system." + item.key
                if key.startswith("system.gpu."):
                    sample[key] = _decode(item.value_json)
            if sample:
                run.gpu_stats.append((at, sample))

    # Summary records win (last write per key); history's last values fill the keys they lack. Summary
    # ``remove`` entries are rare and applied after the fold (exact unless a key was removed, then rewritten).
    summary_values, history_values = log.summary, log.history
    final: dict[str, Any] = {}
    for key, raw in history_values.items():
        if key not in summary_values:
            _set(final, _as_path(key), _decode(raw))
    for key, raw in summary_values.items():
        _set(final, _as_path(key), _decode(raw))
    for key in log.removed:
        _remove(final, _as_path(key))
    run.summary = final
    for key, raw in sorted(config.items(), key=lambda kv: _as_path(kv[0])):
        _set(run.config, _as_path(key), _decode(raw))

    run.created_at = _time(start_seconds)
    for values in (history_values, summary_values):
        stamp = _decode(values.get("_timestamp", ""))
        if isinstance(stamp, (int, float)):
            times.append(float(stamp))
        runtime = _decode(values.get("_runtime", ""))
        if isinstance(runtime, (int, float)):
            runtimes.append(float(runtime))
    if start_seconds is not None:
        times += [start_seconds + r for r in runtimes if r == r]
    last = max((t for t in times if t == t), default=None)
    run.last_record_at = _time(last) or run.created_at
    return run


def _as_path(key: str | tuple[str, ...]) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (key,)


def _parse_log(joined: bytes, payloads: list, run: OfflineRun):
    """The whole log (``joined``: its payloads concatenated) in one parse; a payload that is not a protobuf is
    dropped alone (and counted)."""
    from google.protobuf.message import DecodeError

    view = _log_view()
    try:
        return view.FromString(joined)
    except DecodeError:
        merged = view()
        for payload in payloads:
            try:
                record = view.FromString(payload)  # alone first: a failed merge would keep part of the record
            except DecodeError:
                run.damage.append(Damage("unparsable", 0, UNPARSABLE))
            else:
                merged.MergeFrom(record)
        return merged


def offline_node(run: OfflineRun, now: datetime, stall: timedelta) -> dict[str, Any]:
    """The run as the GraphQL node ``normalize.run_row`` takes, so an offline run follows the mirrored rules.

    State: an exit record with code 0 is ``finished``, any other code ``failed``; no exit record is
    ``crashed`` when the log's last record is older than ``stall``, else ``running``.
    """
    if run.exit_code is not None:
        state = "finished" if run.exit_code == 0 else "failed"
    elif run.last_record_at is not None and now - run.last_record_at > stall:
        state = "crashed"
    else:
        state = "running"
    iso = "%Y-%m-%dT%H:%M:%S.%fZ"
    config = dict(run.config)
    bookkeeping = config.get("_wandb") if isinstance(config.get("_wandb"), dict) else {}
    if run.cli_version and "cli_version" not in bookkeeping:
        config["_wandb"] = {**bookkeeping, "cli_version": run.cli_version}
    return {
        "name": run.run_id,
        "displayName": run.display_name or None,
        "state": state,
        "createdAt": run.created_at.strftime(iso) if run.created_at else None,
        "heartbeatAt": run.last_record_at.strftime(iso) if run.last_record_at else None,
        "config": json.dumps({k: {"value": v} for k, v in config.items()}, default=str),
        "summaryMetrics": json.dumps(run.summary, default=str),
        "tags": run.tags,
        "sweepName": run.sweep_id or None,
        "group": run.group or None,
        "jobType": run.job_type or None,
        "user": {},
        # the last system sample, as the runs query's systemMetrics (GPU count and utilisation when nothing says more)
        "systemMetrics": json.dumps(run.gpu_stats[-1][1]) if run.gpu_stats else None,
    }


def local_metadata(log_path: str | os.PathLike) -> dict[str, Any] | None:
    """The run's ``files/wandb-metadata.json`` beside its log (the client writes it offline too), in the shape
    of ``fetch.read_metadata_file``: ``{"status": "read", "gpu_count", "gpu"}``, ``malformed``, or None when absent."""
    try:
        raw = read_regular_file(Path(log_path).parent / "files" / METADATA_FILE, METADATA_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError:
        return {"status": "malformed"}
    return machine_metadata(raw)


@dataclass
class IngestReport:
    """What one scan of offline logs found and read (``rows``: ``runs`` rows; ``files``: one entry per log read)."""

    found: int = 0
    unchanged: int = 0
    gone_quiet: int = 0
    missing: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    #: Logs of another entity/project than the one mirrored (read, recorded, not loaded).
    other_project: int = 0
    #: Logs read before, under the scanned paths, that are gone now (their running runs are crashed).
    vanished: list[str] = field(default_factory=list)
    #: Each loaded run's curves (``log_curves``), by (entity, project, run id), when they were asked for.
    curves: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def damaged(self) -> list[dict[str, Any]]:
        return [f for f in self.files if f["damage"]]

    def damage_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.files:
            for damage in entry["damage"]:
                counts[damage["kind"]] = counts.get(damage["kind"], 0) + 1
        return counts


#: The points of an offline log's GPU stream kept (sampled as W&B samples a synced run's system stream): the same
#: default as WANDB_ASSETS_HISTORY_SAMPLES.
GPU_STREAM_SAMPLES = 500


def read_changed_logs(
    paths: Iterable[str | os.PathLike],
    known: dict[str, tuple[int, int]],
    *,
    now: datetime,
    stall: timedelta,
    default_gpus: int,
    gpu_count_keys: tuple[str, ...] | None = None,
    workers: int = 1,
    gone_quiet: Iterable[str] = (),
    entity: str | None = None,
    project: str | None = None,
    selection: ProjectSelection | None = None,
    curves: tuple[list[str], int] = ([], GPU_STREAM_SAMPLES),
) -> IngestReport:
    """Find the logs under ``paths``, read those new or changed since ``known`` (``{path: (size, mtime_ns)}``)
    and turn each into a ``runs`` row with the mirrored rules (``normalize.run_row``). One row per run (entity,
    project, run id): of two logs of the same run, the one whose last record is later wins (the other's ledger
    entry says so); the same run id in two projects is two runs. ``workers`` > 1 reads in processes.

    ``gone_quiet``: logs read while their run was ``running`` that have since passed the stall threshold; they
    are read again although their bytes did not change, so the run becomes ``crashed`` (its meaning did).
    ``entity``/``project``: when given, a log of another entity or project is recorded but not loaded (a shared
    tree holds many teams' logs; the gauges and alerts are one project's). ``selection``: the projects mirrored
    (``WANDB_ASSETS_PROJECTS``): a log is loaded when its project is named or its entity is mirrored whole.
    ``report.vanished``: logs of the ledger under ``paths`` that no longer exist (the load crashes their runs once
    past the stall threshold).

    GPUs: the client's ``files/wandb-metadata.json`` next to the log gives the count and model (as W&B's copy does
    for mirrored runs); the log's stats records give the latest sample. ``curves``: ``(history keys, samples)``:
    each loaded run's curves (``log_curves``: sampled as W&B samples the synced run's), in ``report.curves``; its GPU
    stream always (no history key: the stream alone), whose idle GPU-hours the load judges by the one hold rule
    (``lib.idle``) as an online run's."""
    from wandb_assets.lib.normalize import mend_text, run_row

    def stored(path: str) -> str:  # a non-UTF-8 byte in a path (a surrogate here) is U+FFFD in the warehouse
        return mend_text(path)[0]

    files, missing = find_run_logs(paths)
    report = IngestReport(found=len(files), missing=missing)
    states = file_states(files)
    present = {stored(p) for p in states}
    roots = [stored(str(Path(p).resolve())) for p in paths if str(p) not in missing]
    report.vanished = sorted(
        path
        for path in known
        if path not in present and any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)
    )
    gone = set(gone_quiet)
    quiet = {p for p, state in states.items() if stored(p) in gone and known.get(stored(p)) == state}
    changed = [p for p, state in states.items() if known.get(stored(p)) != state or p in quiet]
    report.unchanged, report.gone_quiet = len(states) - len(changed), len(quiet)
    read = functools.partial(_read_log, curves=curves, now=now)
    if workers > 1 and len(changed) > 16:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            both = list(pool.map(read, changed, chunksize=8))
    else:
        both = [read(p) for p in changed]
    runs = [run for run, _ in both]
    run_curves = {run.path: found for run, found in both}
    best: dict[tuple[str, str, str], tuple[datetime, dict[str, Any], dict[str, Any]]] = {}
    logs: dict[tuple[str, str, str], OfflineRun] = {}
    for run in runs:
        size, mtime_ns = states[run.path]
        entry = {
            "path": stored(run.path),
            "size": size,
            "mtime_ns": mtime_ns,
            "run_id": run.run_id,
            "records": run.records,
            "history_items": run.history_items,
            "damage": [{"kind": d.kind, "offset": d.offset, "detail": d.detail} for d in run.damage],
            "loaded": "loaded" if run.run_id else "no run record",
        }
        report.files.append(entry)
        if not run.run_id:
            continue
        if not _wanted(run.entity or entity, run.project, entity, project, selection):
            entry["loaded"] = f"other project: {run.entity}/{run.project}"
            report.other_project += 1
            continue
        row = run_row(  # a log without an entity is the mirrored entity's (W&B would file it there when synced)
            offline_node(run, now, stall),
            entity=run.entity or entity or "",
            project=run.project or project or "",
            app_url="",
            default_gpus=default_gpus,
            metadata=local_metadata(run.path),
            **({"gpu_count_keys": gpu_count_keys} if gpu_count_keys is not None else {}),
        )
        row.update(url=None, source="offline", log_path=entry["path"])
        entry.update(entity=row["entity"], project=row["project"])
        if run.damage:
            row["anomalies"] = [*row["anomalies"], "log_damaged"]
        if entry["path"] != run.path and "text_encoding" not in row["anomalies"]:
            row["anomalies"] = [*row["anomalies"], "text_encoding"]
        when = run.last_record_at or datetime.min
        key = (row["entity"], row["project"], row["run_id"])
        if key in best and when <= best[key][0]:
            entry["loaded"] = "kept newer log"
            continue
        if key in best:
            best[key][2]["loaded"] = "kept newer log"
        best[key] = (when, row, entry)
        logs[key] = run
    report.rows = [row for _, row, _ in best.values()]
    for key, (_, row, _) in best.items():
        if run_curves.get(logs[key].path) is not None:
            report.curves[key] = run_curves[logs[key].path] | {"final": row["state"] in ENDED_STATES}
    return report


def _read_log(path: str, curves: tuple[list[str], int], now: datetime) -> tuple[OfflineRun, dict[str, Any] | None]:
    """``read_offline_run``, and the log's curves (``log_curves``) when asked for: both in the reading process."""
    run = read_offline_run(path)
    return run, log_curves(run, list(curves[0]), curves[1], now) if run.run_id else None


def log_curves(run: OfflineRun, keys: list[str], samples: int, read_at: datetime) -> dict[str, Any]:
    """A log's curves, sampled as W&B samples a run's (what the local server models, ``downsample`` of each): per
    key, the history rows holding ``_step``, ``_timestamp`` and it, at most ``samples`` of them, the first and last
    kept; the system stream (its stats records' GPU items) likewise. So the same run synced and read online gives
    the same points. One pass over the log's history records (a 10,000-step log's 30,000 records parse in ~0.03 s)."""
    from wandb.proto import wandb_internal_pb2

    from wandb_assets.lib.curves import read_curves
    from wandb_assets.lib.downsample import downsample

    try:  # the history records only where keys are asked for (the GPU stream is the reader's already)
        payloads, _ = read_frames(read_regular_file(run.path)) if keys else ([], None)
    except OSError:
        payloads = []
    wanted = {"_step", "_timestamp", *keys}
    rows: list[dict[str, Any]] = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a damaged record is the reader's to count; the curves skip it
            continue
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            nested = item.nested_key
            key = (nested[0] if len(nested) == 1 else ".".join(nested)) if nested else item.key
            if key in wanted:
                row[key] = item.value_json  # decoded only if sampled
        rows.append(row)
    sampled = [
        [
            {k: _decode(row[k]) for k in ("_step", "_timestamp", key)}
            for row in downsample(
                [r for r in rows if "_step" in r and "_timestamp" in r and key in r], samples, keep={0}
            )
        ]
        for key in keys
    ]
    events = downsample([{"_timestamp": at, **sample} for at, sample in run.gpu_stats], samples, keep={0})
    return read_curves({"sampledHistory": sampled, "events": events}, keys, read_at)


def _wanted(
    entity: str | None,
    project: str | None,
    only_entity: str | None,
    only_project: str | None,
    selection: ProjectSelection | None,
) -> bool:
    """Whether a log of ``entity/project`` is loaded: one of the ``selection``'s projects, else of ``only_entity`` /
    ``only_project`` where given (unset: any)."""
    if selection is not None:
        return bool(entity) and selection.includes(entity, project or "")
    return not ((only_entity and entity and entity != only_entity) or (only_project and project != only_project))
