"""The curves of a run: its sampled training history (chosen metric keys, by step) and its sampled system stream (each
GPU's utilisation, memory and power over time), read for many runs in one request. No Dagster here.

W&B's ``Run`` type answers ``sampledHistory(specs: [JSONString!]!)``: one list of row objects per spec
``{"keys": [...], "samples": N}``, holding only rows that have every key of the spec, at most N of them; and
``events(samples: Int)``: the system stream, a list of JSON strings (``_timestamp``, ``system.gpu.<i>.gpu``,
``system.gpu.<i>.memory``, ``system.gpu.<i>.powerWatts``, ...). Both are asked of every run node of a runs
connection filtered by name, so ``CURVES_RUNS_PER_REQUEST`` runs' curves are one request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from wandb_assets.lib.accounting.gpus import MAX_GPUS, SYSTEM_GPU_KEY
from wandb_assets.lib.fetch import RUN_METADATA_FILE_FIELD, metadata_file_url
from wandb_assets.lib.sql import sql_string

#: Runs whose curves one request asks for: W&B meters by database time, and pages with curves stay small.
CURVES_RUNS_PER_REQUEST = 20
#: The most samples a spec may ask for (larger values have answered 500).
MAX_SAMPLES = 1000

#: ``runs.curves_status``: the curves were read (``read``: some rows; ``none``: the run logged none of the keys and
#: no system stream), or the last read failed (``failed``, read again by a later fetch); NULL: not read yet.
READ, NONE, FAILED = "read", "none", "failed"
CURVES_STATUSES = (READ, NONE, FAILED)


#: Our own query: each named run's sampled history (one spec per metric) and system stream.
CURVES_QUERY = """
query RunCurves($project: String!, $entity: String!, $filters: JSONString, $perPage: Int, $cursor: String,
                $order: String, $specs: [JSONString!]!, $samples: Int) {
  project(name: $project, entityName: $entity) {
    runCount(filters: $filters)
    runs(filters: $filters, after: $cursor, first: $perPage, order: $order) {
      edges { node { name sampledHistory(specs: $specs) events(samples: $samples) } cursor }
      pageInfo { endCursor hasNextPage }
    }
  }
}
"""
#: The same, with each run's W&B user and e-mail (the idle ladder tells the owner).
CURVES_WITH_USER_QUERY = CURVES_QUERY.replace(
    "events(samples: $samples)", f"events(samples: $samples) user {{ username email }} {RUN_METADATA_FILE_FIELD}"
)


def parse_answer(text: str) -> Any:
    """The body of a ``CURVES_QUERY`` answer (wandb-core hands it over as text) as the client's ``json.loads`` reads
    it, by orjson where orjson reads it (1.0 against 2.2 ms of CPU a run's curves), else by ``json.loads`` (NaN and
    the infinities, a number beyond a double, a lone surrogate's escape). One difference, which the curves never see:
    orjson reads an integer beyond 64 bits as the float nearest it, which is what the parse makes of that integer."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def history_specs(keys: Iterable[str], samples: int) -> list[str]:
    """One spec per metric key, each with ``_step`` and ``_timestamp`` (a spec returns only rows holding all its
    keys: one spec for several metrics would drop the steps where any one is missing)."""
    return [json.dumps({"keys": ["_step", "_timestamp", key], "samples": samples}) for key in keys]


#: ``status`` of a read whose points are still as W&B sent them (``read_curves``): ``parse_reads`` and
#: ``CurvesFolder`` make it ``read`` or ``none``.
RAW = "raw"

#: The one parse of a run's curves (``parse_rows``; issue 54: 14 ms of Python a run, point by point, before): DuckDB's,
#: set-based, from ``raw`` (one row per run: ``r``, its place, which the points carry instead of the run's three names
#: until they are written; entity, project, run_id, status, read_at, final, keys, sampled as W&B sent it, the texts of
#: its events) into ``parsed_history``, ``parsed_gpu`` and ``parsed_reads``. The native scan (``_curves_scan.c``,
#: where built) reads first what needs no choice: each run's history from the client's parsed answer and each plain
#: event text (``native_history``, ``native_gpu``), leaving DuckDB the rest. Text holding numbers alone (W&B's own) is
#: parsed straight into structs of doubles; the rest as objects of JSON values, each typed one by one: the same rules
#: (``tests/reference/curves.py`` holds every path to them). The rules:
#: - a number is a JSON number, finite (not a boolean, NaN, an infinity, or an integer too large for a double);
#: - a history point: the spec of ``keys[i]`` is ``sampled[i]``, a list of objects; a point needs a number
#:   ``_step`` that is whole and fits a BIGINT and a number under its key; the first point of a step in a series
#:   stands; its time is ``_timestamp`` (seconds) from 1970 to before the year 10000, else NULL;
#: - a GPU sample: an event is an object, or a string holding one (W&B sends strings; one that is not JSON is
#:   skipped); it needs a time as above; every ``system.gpu.<i>.<what>`` key (``i`` 0-9999 ASCII digits, below
#:   ``MAX_GPUS``; ``what`` ASCII letters) with a number gives GPU ``i`` a row: util (``gpu``), memory
#:   (``memory``) and power (``powerWatts``), NULL where the event lacks one; a key twice in an event's text: its
#:   first value; two keys naming one reading (``system.gpu.01.gpu``, ``system.gpu.1.gpu``): the larger;
#: - a run not failed is ``read`` when it has a point of either, else ``none``; ``final`` only when not failed.
_NUMBER = (
    "CASE WHEN json_type({0}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') AND isfinite(TRY_CAST({0} AS DOUBLE)) "
    "THEN TRY_CAST({0} AS DOUBLE) END"
)
_MOMENT = "CASE WHEN {0} >= 0 AND {0} < 253402300800 THEN make_timestamp(round({0} * 1000000)::BIGINT) END"
#: Text whose every value is a JSON number (no ``:`` before anything but a digit or a minus sign: a string, boolean,
#: null, list or object value, or a key holding a colon, fail it): its parse takes the fast path, a struct of doubles.
_NUMBERS_ONLY = "NOT regexp_matches({0}, ':\\s*[^-0-9\\s]')"
_FINITE = "CASE WHEN isfinite({0}) THEN {0} END"


def _struct_type(fields: Iterable[str]) -> str:
    """A ``from_json`` struct of doubles of ``fields``, as SQL text."""
    return sql_string(json.dumps({field: "DOUBLE" for field in fields}))


def _field(struct: str, key: str) -> str:
    return f'{struct}."' + key.replace('"', '""') + '"'


def _distinct_but_for_case(fields: list[str]) -> bool:
    """Whether ``fields`` can be a struct's (DuckDB's struct fields are the same but for case)."""
    return len({field.lower() for field in fields}) == len(set(fields))


#: The history points the native scan read (``native_history``: ``_curves_scan.history_points``' columns).
_HISTORY_NATIVE = """
UNION ALL
SELECT r, i, keys[i] AS metric, ord, step, value, seconds FROM native_history JOIN raw USING (r)"""


def _history_sql(keys: list[str], native: bool = False) -> str:
    """``parsed_history`` from ``raw`` (and ``native_history`` when ``native``: the points the native scan read,
    whose runs' ``sampled`` is then NULL); ``keys``: every metric key of its runs. A run whose ``sampled`` holds
    numbers alone is parsed straight into structs of doubles (``_step``, ``_timestamp`` and the keys); the others,
    and all when the keys cannot be a struct's fields, as objects of JSON values typed one by one: the same rules."""
    fields = list(dict.fromkeys(["_step", "_timestamp", *keys]))
    fast = _NUMBERS_ONLY.format("sampled") if _distinct_but_for_case(fields) else "false"
    whens = " ".join(f"WHEN {sql_string(key)} THEN {_field('point', key)}" for key in dict.fromkeys(keys))
    value = f"CASE metric {whens} END" if whens else "NULL::DOUBLE"

    def numbers(name: str, parsed_as: str, where: str, step: str, reading: str, seconds: str) -> str:
        return f"""{name}_specs AS (
    SELECT r, keys, CASE WHEN {where} THEN try(from_json(sampled, {parsed_as})) END AS specs
    FROM runs WHERE {where}  -- the CASE: the parse is never of the other path's runs
), {name}_series AS (
    SELECT r, keys, unnest(specs) AS points, unnest(generate_series(1, len(specs))) AS i
    FROM {name}_specs WHERE specs IS NOT NULL
), {name}_points AS (
    SELECT r, i, keys[i] AS metric, unnest(points) AS point,
           unnest(generate_series(1, len(points))) AS ord
    FROM {name}_series WHERE i <= len(keys)
), {name} AS (
    SELECT r, i, metric, ord, {step} AS step, {reading} AS value, {seconds} AS seconds
    FROM {name}_points WHERE point IS NOT NULL
)"""

    general = numbers(
        "general",
        """'[["MAP(VARCHAR, JSON)"]]'""",
        "NOT fast",
        _NUMBER.format("point['_step']"),
        _NUMBER.format("point[metric]"),
        _NUMBER.format("point['_timestamp']"),
    )
    fast_path = numbers(
        "fast",
        f"'[[' || {_struct_type(fields)} || ']]'",
        "fast",
        _FINITE.format("point._step"),
        _FINITE.format(value),
        _FINITE.format("point._timestamp"),
    )
    return f"""
CREATE OR REPLACE TEMP TABLE parsed_history AS
WITH runs AS (
    SELECT r, keys, sampled, {fast} AS fast
    FROM raw WHERE status = '{RAW}' AND starts_with(sampled, '[') AND len(keys) > 0
), {general}, {fast_path}
SELECT r, metric, step::BIGINT AS step, {_MOMENT.format("seconds")} AS "timestamp", value,
       i, ord
FROM (SELECT * FROM general UNION ALL SELECT * FROM fast{_HISTORY_NATIVE if native else ""})
WHERE value IS NOT NULL AND step = floor(step) AND step >= -9223372036854775808.0 AND step < 9223372036854775808.0
"""


#: The first point of a step in a series stands: run only when a step repeats (W&B's samples never do; the window
#: over every point cost a tenth of the parse).
REPEATED_STEPS_SQL = "SELECT count(*) > count(DISTINCT (r, i, step)) FROM parsed_history"
FIRST_OF_A_STEP_SQL = """
CREATE OR REPLACE TEMP TABLE parsed_history AS
SELECT * FROM parsed_history QUALIFY row_number() OVER (PARTITION BY r, i, step ORDER BY ord) = 1
"""


#: Between the texts of a run's events in ``raw.events``: a control character no JSON text holds unescaped (an event
#: holding one is no JSON, skipped alike). One string a run, split in DuckDB: a list of 500 strings a run, passed as
#: a parameter, cost 1.7 ms a run; one joined string 0.4.
EVENT_SEPARATOR = "\x1e"


#: The system stream's events that may be objects (W&B sends each as a string holding one; ``raw.events`` is their
#: texts, ``raw.event_ords`` their places in the run's list, NULL: one after the other from 1), and whether their
#: parse may take the fast path (``_NUMBERS_ONLY``).
EVENTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE parsed_events AS
SELECT *, {_NUMBERS_ONLY.format("text")} AS fast
FROM (SELECT r, unnest(texts) AS text, unnest(coalesce(event_ords, generate_series(1, len(texts)))) AS ord
      FROM (SELECT *, string_split(events, chr({ord(EVENT_SEPARATOR)})) AS texts FROM raw
            WHERE status = '{RAW}' AND events IS NOT NULL))
WHERE starts_with(ltrim(text), '{{');
"""
#: The keys of the events that may take the fast path (``_gpu_sql``).
EVENT_KEYS_SQL = "SELECT DISTINCT unnest(try(json_keys(text))) FROM parsed_events WHERE fast"

#: A GPU sample of the general path: each event parsed to a map of JSON values, each value typed one by one.
_GPU_GENERAL = f"""
parsed AS (  -- text that is no JSON object is skipped
    SELECT r, ord, try(from_json(text, '"MAP(VARCHAR, JSON)"')) AS sample
    FROM parsed_events WHERE $general
), timed AS (
    SELECT r, ord, sample,
           {_MOMENT.format(_NUMBER.format("sample['_timestamp']"))} AS "timestamp"
    FROM parsed WHERE sample IS NOT NULL
), readings AS (  -- a key twice: its first value stands (as the fast path's struct takes it)
    SELECT r, ord, "timestamp", entry.key AS key, {_NUMBER.format("entry.value")} AS reading
    FROM (SELECT *, unnest(map_entries(sample)) AS entry,
                 unnest(generate_series(1, cardinality(sample)::BIGINT)) AS position
          FROM timed WHERE "timestamp" IS NOT NULL)
    QUALIFY row_number() OVER (PARTITION BY r, ord, key ORDER BY position) = 1
), gpu_readings AS (
    SELECT r, ord, "timestamp", reading,
           regexp_extract(key, '{SYSTEM_GPU_KEY.pattern}', ['gpu', 'what']) AS part
    FROM readings WHERE key LIKE 'system.gpu.%'
), general AS (
    SELECT r, ord, "timestamp", part.gpu::INTEGER AS gpu,
           max(reading) FILTER (WHERE part.what = 'gpu') AS util_pct,
           max(reading) FILTER (WHERE part.what = 'memory') AS memory_pct,
           max(reading) FILTER (WHERE part.what = 'powerWatts') AS power_w
    FROM gpu_readings
    WHERE part.gpu <> '' AND reading IS NOT NULL AND part.gpu::INTEGER < {MAX_GPUS}
    GROUP BY r, ord, "timestamp", part.gpu::INTEGER
)"""

_GPU_WHATS = {"gpu": "util_pct", "memory": "memory_pct", "powerWatts": "power_w"}


#: The GPU samples the native scan read (``native_gpu``: ``_curves_scan.gpu_samples``' columns, NaN read as NULL).
_GPU_NATIVE = f"""
UNION ALL
SELECT * FROM (
    SELECT r, ord, {_MOMENT.format("seconds")} AS "timestamp", gpu, util_pct, memory_pct, power_w FROM native_gpu
) WHERE "timestamp" IS NOT NULL"""


def _gpu_sql(keys: Iterable[str], native: bool = False) -> str:
    """``parsed_gpu`` from ``parsed_events`` (and ``native_gpu`` when ``native``: the samples the native scan read
    from the events it took, which ``parsed_events`` then lacks). ``keys``: every key of the events that may take
    the fast path. When
    their GPU keys allow it (no two the same but for case, as DuckDB's struct fields would be), those events are parsed
    straight into a struct of doubles of ``_timestamp`` and their GPU keys (a key twice: its first value), one row per
    GPU with a finite reading: the general path's rule; the other events take the general path. Else every event
    takes the general path."""
    keys = set(keys)
    gpus: dict[int, list[tuple[str, str]]] = {}
    for key in sorted(keys):
        match = SYSTEM_GPU_KEY.match(key)
        if match and int(match.group(1)) < MAX_GPUS:
            gpus.setdefault(int(match.group(1)), []).append((key, match.group(2)))
    fields = ["_timestamp", *(key for parts in gpus.values() for key, _ in parts)]
    fast = _distinct_but_for_case(fields)
    general = _GPU_GENERAL.replace("$general", "NOT fast" if fast else "true")
    if not fast or not gpus:
        fast_rows = ""
    else:
        finite = {key: _FINITE.format(_field("s", key)) for key in fields}
        gpu_structs = []
        for gpu, parts in gpus.items():
            values = {
                column: f"greatest({', '.join(finite[key] for key, what in parts if what == name)})"
                if any(what == name for _, what in parts)
                else "NULL::DOUBLE"
                for name, column in _GPU_WHATS.items()
            }
            held = f"coalesce({', '.join(finite[key] for key, _ in parts)})"
            gpu_structs.append(
                f"{{'gpu': {gpu}, 'held': {held}, "
                + ", ".join(f"'{column}': {value}" for column, value in values.items())
                + "}"
            )
        fast_rows = f"""
UNION ALL
SELECT r, ord, "timestamp", g.gpu, g.util_pct, g.memory_pct, g.power_w
FROM (
    SELECT r, ord, {_MOMENT.format(finite["_timestamp"])} AS "timestamp",
           unnest([{", ".join(gpu_structs)}]) AS g
    FROM (SELECT r, ord, try(from_json(text, {_struct_type(fields)})) AS s
          FROM parsed_events WHERE fast)
)
WHERE "timestamp" IS NOT NULL AND g.held IS NOT NULL"""
    native_rows = _GPU_NATIVE if native else ""
    return f"""
CREATE OR REPLACE TEMP TABLE parsed_gpu AS
WITH {general}
SELECT r, "timestamp", gpu, util_pct, memory_pct, power_w, ord
FROM (SELECT r, ord, "timestamp", gpu, util_pct, memory_pct, power_w FROM general{fast_rows}{native_rows})
"""


READS_SQL = f"""
CREATE OR REPLACE TEMP TABLE parsed_reads AS
SELECT entity, project, run_id,
       CASE WHEN status <> '{RAW}' THEN status
            WHEN r IN (SELECT r FROM parsed_history) OR r IN (SELECT r FROM parsed_gpu) THEN '{READ}'
            ELSE '{NONE}' END AS status,
       read_at, coalesce(final, false) AND status <> '{FAILED}' AS final
FROM raw;
"""

#: ``raw`` from the reads' columns (``raw_row``), list parameters of one value per run.
RAW_FROM_ROWS_SQL = """
CREATE OR REPLACE TEMP TABLE raw AS
SELECT unnest(range(len($entity::VARCHAR[]))) AS r, unnest($entity::VARCHAR[]) AS entity,
       unnest($project::VARCHAR[]) AS project, unnest($run_id::VARCHAR[]) AS run_id,
       unnest($status::VARCHAR[]) AS status,
       unnest($read_at::VARCHAR[])::TIMESTAMP AS read_at, unnest($final::BOOLEAN[]) AS final,
       unnest($keys::VARCHAR[][]) AS keys, unnest($sampled::VARCHAR[]) AS sampled,
       unnest($events::VARCHAR[]) AS events, unnest($event_ords::INTEGER[][]) AS event_ords
"""
_RAW_COLUMNS = ("entity", "project", "run_id", "status", "read_at", "final", "keys", "sampled", "events")

_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _text(value: str) -> str:
    """``value`` as DuckDB takes it: a lone UTF-16 surrogate (no UTF-8 for it) written as U+FFFD."""
    return _SURROGATE.sub("\ufffd", value)


def _json(value: Any) -> str:
    """``value`` as JSON text DuckDB's reader takes: orjson's (a tenth of ``json.dumps``' time: 1.4 ms a run's curves
    less; it writes NaN and the infinities as null, which the parse drops alike), else (an integer beyond 64 bits, a
    lone surrogate) ``json.dumps``' with a lone surrogate's escape, which DuckDB refuses, written as U+FFFD."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        pass
    return _escapes_readable(json.dumps(value))


def _escapes_readable(text: str) -> str:
    """JSON ``text`` with each lone surrogate's escape, which DuckDB's reader refuses, written as U+FFFD."""
    return _LONE_SURROGATE.sub(r"\\ufffd", text) if "\\ud" in text or "\\uD" in text else text


def _event_texts(events: Any, places: list[int] | None = None) -> tuple[str | None, list[int] | None]:
    """The texts of the events W&B sent that may be objects, joined by ``EVENT_SEPARATOR``: each string as it is (no
    parse in Python), an object as its JSON; anything else is no sample. None: no event. With them, each text's place
    in its run's list of events (from 1), when ``places`` gives the events' (those the native scan left); None: one
    after the other."""
    if not isinstance(events, list):
        return None, None
    if places is None and all(type(event) is str for event in events):  # W&B's: checked once, on the joined text
        joined = EVENT_SEPARATOR.join(events)
        # ASCII, no escape at all (the search for one character is memchr's), the separator only between them
        if joined.isascii() and "\\" not in joined and joined.count(EVENT_SEPARATOR) == len(events) - 1:
            return joined or None, None
    texts, kept = [], []
    for place, event in zip(places or range(1, len(events) + 1), events, strict=True):
        if isinstance(event, str):
            event = _escapes_readable(event if event.isascii() else _text(event))
        elif isinstance(event, Mapping):
            event = _json(event)
        else:
            continue
        if EVENT_SEPARATOR not in event:
            texts.append(event)
            kept.append(place)
    return (EVENT_SEPARATOR.join(texts), kept) if texts else (None, None)


def raw_row(entity: str, project: str, run_id: str, read: Mapping[str, Any], final: bool) -> tuple:
    """One run's read as ``RAW_FROM_ROWS_SQL``'s columns, its keys, history and events as W&B sent them:
    ``parse_rows`` scans them."""
    return (
        _text(entity),
        _text(project),
        _text(run_id),
        read["status"],
        read["read_at"],
        bool(final),
        list(read.get("keys") or []),
        read.get("sampled"),
        read.get("events"),
    )


try:  # built by setup.py where a C compiler is (optional): else DuckDB parses every run's curves, the same rows
    from wandb_assets.lib import _curves_scan as _native
except ImportError:  # pragma: no cover - the install without a compiler
    _native = None


def scanner() -> str:
    """Which scan of the curves is in use: ``native`` (``_curves_scan.c``, DuckDB parsing what it leaves) or
    ``duckdb`` (DuckDB parsing everything)."""
    return "native" if _native is not None else "duckdb"


def _register(con, name: str, columns: list[bytes], spec: Mapping[str, str]) -> None:
    """The native scan's ``columns`` (bytes of the numpy types of ``spec``, by name) as ``name`` on ``con`` (NaN read
    as NULL)."""
    import numpy as np

    con.register(
        name,
        {column: np.frombuffer(values, kind) for (column, kind), values in zip(spec.items(), columns, strict=True)},
    )


_HISTORY_COLUMNS = {
    "r": "int32", "i": "int32", "ord": "int32", "step": "float64", "seconds": "float64", "value": "float64",
}  # fmt: skip
_GPU_COLUMNS = {
    "r": "int32", "ord": "int32", "seconds": "float64", "gpu": "int32",
    "util_pct": "float64", "memory_pct": "float64", "power_w": "float64",
}  # fmt: skip


def _scan_history(con, keys: list[list[str]], sampled: list[Any]) -> list[str | None]:
    """The points of ``sampled`` (a run's history as W&B sent it, by its place; None: not read) that the native scan
    reads, registered on ``con`` as ``native_history``; for the parse in DuckDB, the JSON text of the others'
    (without the native scan, of every run's)."""
    if _native is None:
        return [_json(history) for history in sampled]
    *columns, left = _native.history_points(keys, sampled)
    _register(con, "native_history", columns, _HISTORY_COLUMNS)
    texts: list[str | None] = [None] * len(sampled)
    for r in left:
        texts[r] = _json(sampled[r])
    return texts


def _scan_events(con, runs: list[Any]) -> tuple[list[str | None], list[list[int] | None]]:
    """The GPU samples of ``runs``' events (one list a run, by its place) that the native scan takes, registered on
    ``con`` as ``native_gpu``; the texts of the others for the parse in DuckDB, a run's joined, with their places.
    Without the native scan, every event's text."""
    if _native is None:
        texts = [_event_texts(events) for events in runs]
        return [text for text, _ in texts], [places for _, places in texts]
    *columns, rest = _native.gpu_samples(runs)
    _register(con, "native_gpu", columns, _GPU_COLUMNS)
    left: dict[int, tuple[list[Any], list[int]]] = {}
    for r, place, event in rest:
        events, places = left.setdefault(r, ([], []))
        events.append(event)
        places.append(place)
    texts = [_event_texts(*left[r]) if r in left else (None, None) for r in range(len(runs))]
    return [text for text, _ in texts], [places for _, places in texts]


_PARSER: Any = None
_PARSER_LOCK = threading.Lock()


def parse_rows(rows: list[tuple]):
    """A connection to this process's in-memory parsing DuckDB holding ``parsed_history``, ``parsed_gpu`` and
    ``parsed_reads`` of ``rows`` (``raw_row``'s; temporary tables: its own). One database for the process: a new one
    per request loaded DuckDB's JSON extension again each time (a quarter of a second, 12 ms a run)."""
    global _PARSER
    import duckdb

    with _PARSER_LOCK:
        if _PARSER is None:  # one thread a query: the requests answer in parallel already
            _PARSER = duckdb.connect(config={"threads": 1})
        con = _PARSER.cursor()
    columns = dict(zip(_RAW_COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
    to_parse = [status == RAW for status in columns["status"]]
    columns["sampled"] = _scan_history(
        con, columns["keys"], [sampled if r else None for sampled, r in zip(columns["sampled"], to_parse, strict=True)]
    )
    columns["keys"] = [[_text(key) for key in keys] for keys in columns["keys"]]
    columns["events"], columns["event_ords"] = _scan_events(
        con, [events if r else None for events, r in zip(columns["events"], to_parse, strict=True)]
    )
    con.execute(RAW_FROM_ROWS_SQL, columns)
    metrics = [key for (key,) in con.execute("SELECT DISTINCT unnest(keys) FROM raw").fetchall()]
    con.execute(_history_sql(metrics, native=_native is not None))
    if con.execute(REPEATED_STEPS_SQL).fetchone()[0]:
        con.execute(FIRST_OF_A_STEP_SQL)
    con.execute(EVENTS_SQL)
    event_keys = [key for (key,) in con.execute(EVENT_KEYS_SQL).fetchall()]
    con.execute(_gpu_sql(event_keys, native=_native is not None))
    con.execute(READS_SQL)
    return con


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def parse_reads(reads: Mapping[tuple[str, str, str], Mapping[str, Any]]) -> dict[tuple[str, str, str], dict]:
    """``reads`` (``{(entity, project, run_id): read_curves(...) or failed_curves(...)}``) with their points:
    ``status`` ``read``/``none`` (or ``failed``), ``history`` rows ``[metric, step, timestamp (ISO), value]`` and
    ``gpu`` rows ``[timestamp (ISO), gpu, util_pct, memory_pct, power_w]``, by ``parse_rows`` (for the few runs the
    idle ladder reads; the curves job writes them to files, ``CurvesFolder``)."""
    rows = [raw_row(*key, read, False) for key, read in reads.items()]
    parsed = {key: {**read, "history": [], "gpu": []} for key, read in reads.items()}
    if not rows:
        return parsed
    con = parse_rows(rows)
    try:
        for *key, status in con.execute("SELECT entity, project, run_id, status FROM parsed_reads").fetchall():
            parsed[tuple(key)]["status"] = status
        for *key, metric, step, at, value in con.execute(_ORDERED[HISTORY_FILE]).fetchall():
            parsed[tuple(key)]["history"].append([metric, step, _iso(at), value])
        for *key, at, gpu, util, memory, power in con.execute(_ORDERED[GPU_FILE]).fetchall():
            parsed[tuple(key)]["gpu"].append([_iso(at), gpu, util, memory, power])
    finally:
        con.close()
    return parsed


#: ``read_at`` of a read parsed for its points alone (``history_rows``, ``gpu_rows``): never stored.
_POINTS_ONLY_READ_AT = "1970-01-01T00:00:00"


def history_rows(keys: list[str], sampled: Any) -> list[list]:
    """``[metric, step, timestamp (ISO, UTC), value]`` of one run's ``sampledHistory`` by ``parse_rows``."""
    read = {"status": RAW, "read_at": _POINTS_ONLY_READ_AT, "sampled": sampled, "keys": keys}
    return parse_reads({("", "", ""): read})[("", "", "")]["history"]


def gpu_rows(events: Any) -> list[list]:
    """``[timestamp (ISO, UTC), gpu, util_pct, memory_pct, power_w]`` of one run's ``events`` by ``parse_rows``."""
    read = {"status": RAW, "read_at": _POINTS_ONLY_READ_AT, "events": events, "keys": []}
    return parse_reads({("", "", ""): read})[("", "", "")]["gpu"]


def read_curves(node: Mapping[str, Any], keys: list[str], read_at: datetime) -> dict[str, Any]:
    """What a run node of ``CURVES_QUERY`` holds, as W&B sent it (``status`` ``raw``: its points are parsed by
    ``parse_rows``, never one by one in Python), with the W&B user's e-mail and where its wandb-metadata.json is
    when the query asked (the idle ladder's)."""
    read = {
        "status": RAW,
        "read_at": read_at.isoformat(),
        "keys": list(keys),
        "sampled": node.get("sampledHistory"),
        "events": node.get("events"),
    }
    user = node.get("user")
    if isinstance(user, Mapping) and isinstance(user.get("email"), str) and "@" in user["email"]:
        read["email"] = user["email"].strip()
    if "files" in node:  # the ladder's query: where the run's wandb-metadata.json is (its own GPU count)
        read["metadata_url"] = metadata_file_url(node)
    return read


def failed_curves(read_at: datetime, why: str) -> dict[str, Any]:
    return {"status": FAILED, "read_at": read_at.isoformat(), "error": why}


#: Under ``WANDB_ASSETS_STAGING_DIR``: one folder per read of curves (``CurvesFolder``), loaded by ``run_curves``.
CURVES_FOLDER = "curves"
#: The three files of a request in a folder, each Parquet (typed columns): which runs were read, their history and
#: their GPU samples (``READS_HEADER``, ...: their columns). Folders written before issue 54 hold CSV files of the
#: same columns (``NULL_MARK`` for NULL), still loaded.
READS_FILE, HISTORY_FILE, GPU_FILE = "reads", "history", "gpu"
READS_HEADER = ["entity", "project", "run_id", "status", "read_at", "final"]
HISTORY_HEADER = ["entity", "project", "run_id", "metric", "step", "timestamp", "value"]
GPU_HEADER = ["entity", "project", "run_id", "timestamp", "gpu", "util_pct", "memory_pct", "power_w"]
NULL_MARK = "\\N"
#: Each file's rows from the parse's tables (in no order: the load needs none).
_PARSED = {
    READS_FILE: "FROM parsed_reads",
    HISTORY_FILE: f"SELECT {', '.join(HISTORY_HEADER)} FROM parsed_history JOIN raw USING (r)",
    GPU_FILE: f"SELECT {', '.join(GPU_HEADER)} FROM parsed_gpu JOIN raw USING (r)",
}
#: The same in the order W&B sent them (``parse_reads``).
_ORDERED = {
    HISTORY_FILE: f"{_PARSED[HISTORY_FILE]} ORDER BY entity, project, run_id, i, ord",
    GPU_FILE: f"{_PARSED[GPU_FILE]} ORDER BY entity, project, run_id, ord, gpu",
}


class CurvesFolder:
    """The curves one read brings, as typed point files (Parquet, one row per point) written as each request
    answers: each request's runs parsed by ``parse_rows`` in DuckDB (nothing of them point by point in Python), and
    nothing of a run's curves kept in memory after its request; the load reads the files straight into its inserts.
    Written under a hidden name and renamed whole by ``publish``, so a load never sees half a read; a folder not
    published (the read failed) is deleted by ``discard``. Thread-safe: requests answer concurrently (DuckDB works
    outside the GIL, so the parse of one request overlaps the others' transfers)."""

    def __init__(self, staging: Path, name: str) -> None:
        self.root = Path(staging) / CURVES_FOLDER
        self.partial = self.root / f".{name}.partial"
        self.final = self.root / name
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self._lock = threading.Lock()
        self._parts = 0
        self.points = 0
        self.statuses: dict[str, int] = {}

    def add(self, path: str, final: dict[str, bool], read: dict[str, dict]) -> dict[str, int]:
        """The curves of one request: ``read`` (``{run_id: read_curves(...) or failed_curves(...)}``) of the runs of
        ``path`` (``entity/project``); ``final``: whether each run had ended when asked. Returns its runs by status
        (``read``, ``none``, ``failed``)."""
        entity, _, project = path.partition("/")
        with self._lock:
            self._parts += 1
            part = self._parts
        rows = [raw_row(entity, project, run_id, curves, bool(final.get(run_id))) for run_id, curves in read.items()]
        statuses: dict[str, int] = {}
        points = 0
        if rows:
            con = parse_rows(rows)
            try:
                for kind, table in _PARSED.items():
                    target = self.partial / f"{kind}-{part:06d}.parquet"
                    con.execute(f"COPY ({table}) TO {sql_string(str(target))} (FORMAT parquet)")
                statuses = dict(con.execute("SELECT status, count(*) FROM parsed_reads GROUP BY 1").fetchall())
                points = con.execute(
                    "SELECT (SELECT count(*) FROM parsed_history) + (SELECT count(*) FROM parsed_gpu)"
                ).fetchone()[0]
            finally:
                con.close()
        with self._lock:
            self.points += points
            for status, runs in statuses.items():
                self.statuses[status] = self.statuses.get(status, 0) + runs
        return statuses

    def publish(self) -> Path | None:
        """Make the folder visible to the load (None when no request answered: nothing to load)."""
        if not self._parts:
            self.discard()
            return None
        os.replace(self.partial, self.final)
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)


#: Where the curves job sets aside a published read the warehouse cannot hold (under the curves folder; a name with a
#: leading dot is never a published read).
REJECTED_FOLDER = ".rejected"


def published_folders(staging: Path) -> list[Path]:
    """The published reads of curves waiting for their load, oldest first (a later read of a run replaces an earlier
    one)."""
    root = Path(staging) / CURVES_FOLDER
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)
