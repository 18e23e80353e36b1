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

Speed: a 10,000-step run is ~30,000 records. Records are framed in one pass, typed by their first bytes,
and the history and summary records are each parsed as one merged protobuf (concatenated protobufs parse as
their merge, so the repeated items come out in order), then folded last-wins.

Nothing here imports Dagster or reads the environment.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_SEEDS = {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}
#: ``Record`` oneof field numbers (wandb_internal.proto; stable since 0.10).
HISTORY, SUMMARY = 2, 3
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
    host: str = ""
    cli_version: str = ""
    created_at: datetime | None = None
    last_record_at: datetime | None = None
    exit_code: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    records: int = 0
    history_rows: int = 0
    damage: list[Damage] = field(default_factory=list)


def find_run_logs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Every ``.wandb`` file under ``paths`` (a file, a run directory or any folder, searched recursively),
    sorted and without duplicates; and the paths that do not exist."""
    found: set[Path] = set()
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.add(path.resolve())
        elif path.is_dir():
            found.update(p.resolve() for p in path.rglob(LOG_GLOB) if p.is_file())
        else:
            missing.append(str(raw))
    return sorted(found), missing


def file_states(files: Iterable[Path]) -> dict[str, tuple[int, int]]:
    """``{path: (size, mtime_ns)}``: what tells a new or grown log from one already read."""
    states = {}
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        states[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return states


def read_frames(data: bytes) -> tuple[list[bytes], list[Damage]]:
    """The record payloads of a ``.wandb`` file's bytes, in order, and the damage met on the way."""
    damage: list[Damage] = []
    start = len(HEADER)
    if not data.startswith(HEADER[:4]):
        if not _valid_chunk_at(data, 0):
            return [], [Damage("bad_header", 0, "not a .wandb file (no :W&B header, no valid first record)")]
        start = 0  # the earliest 0.10 pre-releases wrote no file header: the log starts at byte 0
    elif data[4:7] != HEADER[4:7]:
        damage.append(Damage("bad_header", 4, f"unknown header magic/version {data[4:7].hex()}; read anyway"))
    payloads: list[bytes] = []
    append = payloads.append
    unpack, crc32, seeds = struct.unpack_from, zlib.crc32, _SEEDS
    offset, size, pending, pending_at = start, len(data), None, 0
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
            damage.append(Damage("corrupt", offset, f"impossible chunk header (type {kind}, length {length})"))
            offset += room
            pending = None
            continue
        if end > size:
            damage.append(Damage("truncated", offset, f"file ends {end - size} bytes into a record"))
            pending = None
            break
        chunk = data[offset + 7 : end]
        if crc32(chunk, seeds[kind]) != checksum:
            damage.append(Damage("corrupt", offset, "CRC mismatch; the rest of the block was skipped"))
            offset += room
            pending = None
            continue
        offset = end
        if kind == FULL:
            if pending is not None:
                damage.append(Damage("corrupt", pending_at, "a record missing its last chunk"))
                pending = None
            append(chunk)
        elif kind == FIRST:
            pending, pending_at = [chunk], offset
        elif pending is None:
            continue  # the middle or end of a record whose start was lost (already counted)
        else:
            pending.append(chunk)
            if kind == LAST:
                append(b"".join(pending))
                pending = None
    if pending is not None:
        damage.append(Damage("truncated", pending_at, "file ends inside a record split over blocks"))
    elif offset < size and not any(d.kind == "truncated" for d in damage) and any(data[offset:]):
        damage.append(Damage("truncated", offset, f"{size - offset} stray bytes after the last record"))
    return payloads, damage


def _valid_chunk_at(data: bytes, offset: int) -> bool:
    if len(data) < offset + 7:
        return False
    checksum, length, kind = struct.unpack_from("<IHB", data, offset)
    chunk = data[offset + 7 : offset + 7 + length]
    return kind in _SEEDS and len(chunk) == length and zlib.crc32(chunk, _SEEDS[kind]) == checksum


#: ``Record`` fields outside its ``record_type`` oneof: num, control, uuid, _info.
_NOT_ONEOF = frozenset((1, 16, 19, 200))


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while i < len(data):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            break
        shift += 7
    return value, i


def _record_type(payload: bytes) -> int:
    """The field number of a serialised ``Record``'s oneof, read from its tags (the fields around the oneof,
    such as ``num`` and ``_info``, are skipped; writers order them differently). 0 if there is none."""
    i, size = 0, len(payload)
    while i < size:
        tag, i = _varint(payload, i)
        number, wire = tag >> 3, tag & 7
        if number not in _NOT_ONEOF:
            return number
        if wire == 0:
            _, i = _varint(payload, i)
        elif wire == 2:
            length, i = _varint(payload, i)
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return 0
    return 0


def _decode(value_json: str) -> Any:
    try:
        return json.loads(value_json) if value_json else None
    except ValueError:
        return value_json  # not JSON: kept as the text it is


def _path(item) -> tuple[str, ...]:
    return (item.key,) if item.key else tuple(item.nested_key)


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


def _fold(items) -> dict[tuple[str, ...], str]:
    """Last value (raw JSON) per key path, over repeated ``update``/``item`` messages in log order."""
    folded: dict[tuple[str, ...], str] = {}
    for item in items:
        folded[(item.key,) if item.key else tuple(item.nested_key)] = item.value_json
    return folded


def _time(seconds: float | None) -> datetime | None:
    if seconds is None or seconds != seconds or seconds <= 0:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None


def read_offline_run(path: str | os.PathLike) -> OfflineRun:
    """Read one ``.wandb`` file: the run's identity, config, final summary, exit and times. Never raises on a
    damaged log (see ``read_frames``); an unreadable file is a ``Damage`` too."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    run = OfflineRun(path=str(path))
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        run.damage.append(Damage("unreadable", 0, f"{type(exc).__name__}: {exc.strerror or exc}"))
        return run
    payloads, run.damage = read_frames(data)
    run.records = len(payloads)
    history: list[bytes] = []
    summary: list[bytes] = []
    others: list[tuple[int, bytes]] = []
    for index, payload in enumerate(payloads):
        kind = _record_type(payload)
        (history if kind == HISTORY else summary if kind == SUMMARY else others).append(
            payload if kind in (HISTORY, SUMMARY) else (index, payload)  # type: ignore[arg-type]
        )
    run.history_rows = len(history)

    config: dict[tuple[str, ...], Any] = {}
    removed_summary: list[tuple[int, tuple[str, ...]]] = []
    times: list[float] = []
    start_seconds: float | None = None
    runtimes: list[float] = []
    for _index, payload in others:
        try:
            record = pb.Record.FromString(payload)
        except DecodeError:
            run.damage.append(Damage("unparsable", 0, "a record that is not a protobuf"))
            continue
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id = r.run_id or run.run_id
            run.entity, run.project = r.entity or run.entity, r.project or run.project
            run.display_name = r.display_name or run.display_name
            run.tags = list(r.tags) or run.tags
            run.group, run.job_type = r.run_group or run.group, r.job_type or run.job_type
            run.sweep_id, run.host = r.sweep_id or run.sweep_id, r.host or run.host
            if r.HasField("start_time"):
                start_seconds = r.start_time.seconds + r.start_time.nanos / 1e9
            for item in r.config.update:
                config[_path(item)] = _decode(item.value_json)
            for item in r.config.remove:
                config.pop(_path(item), None)
        elif kind == "config":
            for item in record.config.update:
                config[_path(item)] = _decode(item.value_json)
            for item in record.config.remove:
                config.pop(_path(item), None)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
            runtimes.append(record.exit.runtime)
        elif kind == "telemetry" and record.telemetry.cli_version:
            run.cli_version = record.telemetry.cli_version
        elif kind == "stats" and record.stats.HasField("timestamp"):
            times.append(record.stats.timestamp.seconds + record.stats.timestamp.nanos / 1e9)

    # Summary records win (last write per key); history's last values fill the keys they lack. Summary
    # ``remove`` entries are rare: they are applied after the fold, which is exact unless a key was
    # removed and then written again.
    merged_summary = _parse_merged(pb, summary, run)
    summary_values = _fold(merged_summary.summary.update) if merged_summary else {}
    if merged_summary:
        removed_summary = [(0, _path(item)) for item in merged_summary.summary.remove]
    merged_history = _parse_merged(pb, history, run)
    history_values = _fold(merged_history.history.item) if merged_history else {}
    final: dict[str, Any] = {}
    for key_path, raw in history_values.items():
        if key_path not in summary_values:
            _set(final, key_path, _decode(raw))
    for key_path, raw in summary_values.items():
        _set(final, key_path, _decode(raw))
    for _, key_path in removed_summary:
        _remove(final, key_path)
    run.summary = final
    for key_path, value in sorted(config.items()):
        _set(run.config, key_path, value)

    run.created_at = _time(start_seconds)
    for values in (history_values, summary_values):
        for key in (("_timestamp",),):
            if key in values:
                stamp = _decode(values[key])
                if isinstance(stamp, (int, float)):
                    times.append(float(stamp))
        if ("_runtime",) in values:
            runtime = _decode(values[("_runtime",)])
            if isinstance(runtime, (int, float)):
                runtimes.append(float(runtime))
    if start_seconds is not None:
        times += [start_seconds + r for r in runtimes if r == r]
    last = max((t for t in times if t == t), default=None)
    run.last_record_at = _time(last) or run.created_at
    return run


def _parse_merged(pb, payloads: list[bytes], run: OfflineRun):
    """One ``Record`` holding every item of ``payloads`` in order (a record that fails alone is dropped)."""
    from google.protobuf.message import DecodeError

    if not payloads:
        return None
    try:
        return pb.Record.FromString(b"".join(payloads))
    except DecodeError:
        merged = pb.Record()
        for payload in payloads:
            try:
                merged.MergeFromString(payload)
            except DecodeError:
                run.damage.append(Damage("unparsable", 0, "a history or summary record that is not a protobuf"))
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
    }


@dataclass
class IngestReport:
    """What one scan of offline logs found and read (``rows``: ``runs`` rows; ``files``: one entry per log read)."""

    found: int = 0
    unchanged: int = 0
    missing: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def damaged(self) -> list[dict[str, Any]]:
        return [f for f in self.files if f["damage"]]

    def damage_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.files:
            for damage in entry["damage"]:
                counts[damage["kind"]] = counts.get(damage["kind"], 0) + 1
        return counts


def _read_one(path: str) -> OfflineRun:
    return read_offline_run(path)


def read_changed_logs(
    paths: Iterable[str | os.PathLike],
    known: dict[str, tuple[int, int]],
    *,
    now: datetime,
    stall: timedelta,
    default_gpus: int,
    workers: int = 1,
) -> IngestReport:
    """Find the logs under ``paths``, read those new or changed since ``known`` (``{path: (size, mtime_ns)}``)
    and turn each into a ``runs`` row with the mirrored rules (``normalize.run_row``). One row per run id: of
    two logs of the same run, the one whose last record is later wins. ``workers`` > 1 reads in processes."""
    from wandb_assets.lib.normalize import run_row

    files, missing = find_run_logs(paths)
    report = IngestReport(found=len(files), missing=missing)
    states = file_states(files)
    changed = [p for p, state in states.items() if known.get(p) != state]
    report.unchanged = len(states) - len(changed)
    if workers > 1 and len(changed) > 16:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            runs = list(pool.map(_read_one, changed, chunksize=8))
    else:
        runs = [read_offline_run(p) for p in changed]
    best: dict[str, tuple[datetime, dict[str, Any]]] = {}
    for run in runs:
        size, mtime_ns = states[run.path]
        entry = {
            "path": run.path,
            "size": size,
            "mtime_ns": mtime_ns,
            "run_id": run.run_id,
            "records": run.records,
            "history_rows": run.history_rows,
            "damage": [{"kind": d.kind, "offset": d.offset, "detail": d.detail} for d in run.damage],
            "loaded": "loaded" if run.run_id else "no run record",
        }
        report.files.append(entry)
        if not run.run_id:
            continue
        row = run_row(
            offline_node(run, now, stall), entity=run.entity, project=run.project, app_url="", default_gpus=default_gpus
        )
        row.update(url=None, source="offline", log_path=run.path)
        if run.damage:
            row["anomalies"] = [*row["anomalies"], "log_damaged"]
        when = run.last_record_at or datetime.min
        if run.run_id not in best or when > best[run.run_id][0]:
            best[run.run_id] = (when, row)
    report.rows = [row for _, row in best.values()]
    return report
