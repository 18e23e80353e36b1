"""Pull requests' training throughput judged against main on the same hardware (issue 45): testbeds, the baseline,
the Student-t boundary, the verdicts and the ``pr_checks`` table. No Dagster, no network.

A run's **testbed** is its GPU count and model (``8xH100-80GB``; ``unknown`` where either is missing). A PR run
(``github.sky.pr<N>.<commit>.<config>.<ts>``, ended: finished or crashed, as the SPS regression rule counts) is judged
per SPS metric against the **baseline**: the last ``k`` main runs of the same config and testbed that had ended when the
sample's last PR run ended (main as the PR saw it: judging again later gives the same verdict). Several PR runs of one
commit and config are one sample (their mean). The **boundary** is Bencher's ``t_test`` lower boundary at
``confidence``: the baseline's mean minus Student's t quantile (n - 1 degrees of freedom) times its standard deviation
times ``sqrt(1 + 1/n)`` (a new run's prediction interval, not the mean's); or, with ``percent``, the baseline median
less that many percent. Verdicts: ``regression`` (below the lower boundary), ``improvement`` (above the upper one), ``no
change``, ``no baseline`` (fewer than ``min_n`` main runs, or testbed ``unknown``: said, never guessed). The boundary is
never narrower than ``min_change_pct`` of the baseline's mean (``WANDB_ASSETS_PR_MIN_CHANGE_PCT``, 2 %): a baseline with
no spread (integer or capped SPS) would otherwise make a 0.08 % change a regression.

A CI run's name is untrusted input (anyone who can log a W&B run chooses it): ``ci_identity`` validates the PR number
(ASCII, 1 to 2^31-1) and the commit (7 to 40 hex digits) before a run is judged; a run that fails is skipped and counted
with the reason, never failing the asset. Whether the commit is the PR's is GitHub's to say, at delivery
(``lib/acting/pr_outbox``).
"""

from __future__ import annotations

import gc
import math
import re
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from wandb_assets.lib.accounting.gpus import UNKNOWN_TESTBED, testbed_sql
from wandb_assets.lib.normalize import SPS_KEYS
from wandb_assets.lib.sql import MIRRORED_RUNS_SQL, dict_rows, literal_path, sql_string, transaction

REGRESSION, IMPROVEMENT, NO_CHANGE, NO_BASELINE = "regression", "improvement", "no change", "no baseline"

PR_CHECKS_COLUMNS = {
    "repo": "VARCHAR",
    "pr": "INTEGER",
    "commit": "VARCHAR",
    "config": "VARCHAR",
    "testbed": "VARCHAR",
    "metric": "VARCHAR",
    "pr_value": "DOUBLE",
    "pr_n": "INTEGER",
    "baseline_median": "DOUBLE",
    "baseline_n": "INTEGER",
    "boundary": "DOUBLE",
    "change_pct": "DOUBLE",
    "verdict": "VARCHAR",
    "judged_at": "TIMESTAMP",
    "pr_runs": "VARCHAR[]",
    "baseline_runs": "VARCHAR[]",
    "pr_run_urls": "VARCHAR[]",
}
#: One verdict: a PR commit's config on a testbed, for one metric.
PR_CHECKS_KEY = ("pr", "commit", "config", "testbed", "metric")
PR_CHECKS_SQL = f"CREATE TABLE IF NOT EXISTS pr_checks ({', '.join(f'{c} {t}' for c, t in PR_CHECKS_COLUMNS.items())})"


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Lentz's continued fraction, Numerical Recipes 6.4)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * h / a


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``; 1e-10)."""
    low, high = -1e3, 1e3
    for _ in range(200):
        middle = (low + high) / 2
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class Verdict:
    pr_value: float
    pr_n: int
    baseline_median: float | None
    baseline_n: int
    boundary: float | None
    change_pct: float | None
    verdict: str


def judge(
    pr_values: list[float],
    baseline: list[float],
    min_n: int = 5,
    confidence: float = 0.99,
    percent: float | None = None,
    min_change_pct: float = 2.0,
) -> Verdict:
    """One metric of one PR commit and config against its baseline (see the module)."""
    value = statistics.fmean(pr_values)
    n = len(baseline)
    if n < max(min_n, 2):
        median = statistics.median(baseline) if baseline else None
        change = 100.0 * (value - median) / median if median else None
        return Verdict(value, len(pr_values), median, n, None, change, NO_BASELINE)
    median = statistics.median(baseline)
    change = 100.0 * (value - median) / median if median else None
    if percent is not None:
        share = max(percent, min_change_pct) / 100
        lower, upper = median * (1 - share), median * (1 + share)
    else:
        mean, spread = statistics.fmean(baseline), statistics.stdev(baseline)
        width = t_quantile(confidence, n - 1) * spread * math.sqrt(1 + 1 / n)
        width = max(width, abs(mean) * min_change_pct / 100)
        lower, upper = mean - width, mean + width
    verdict = REGRESSION if value < lower else IMPROVEMENT if value > upper else NO_CHANGE
    return Verdict(value, len(pr_values), median, n, lower, change, verdict)


#: The largest PR number ``pr_checks.pr`` (INTEGER) holds; GitHub's are far below it.
PR_MAX = 2**31 - 1
_COMMIT_RE = re.compile(r"[0-9a-f]{7,40}")


def ci_identity(branch: str | None, commit: str | None) -> tuple[int, str] | str:
    """A PR run's ``(pr, commit)`` from its parsed name (``pr<N>``, the commit lower-cased), or why it cannot be
    judged: a PR number that is not ASCII digits in 1..2^31-1 (``pr`` + 12 digits once failed every feed), or a commit
    that is not 7 to 40 hex digits (a branch name, a tag)."""
    digits = (branch or "")[2:]
    if not (branch or "").startswith("pr") or not digits.isascii() or not digits.isdigit() or digits.startswith("0"):
        return "the PR number is not a number"
    if len(digits) > 10 or not 1 <= int(digits) <= PR_MAX:
        return "the PR number is out of range"
    sha = (commit or "").lower()
    if not sha.isascii() or not _COMMIT_RE.fullmatch(sha):
        return "the commit is not 7 to 40 hex digits"
    return int(digits), sha


def _metric_values_sql(sps_metric: str) -> str:
    """Each ended CI run's SPS values, one row per metric: the configured metric's steady SPS where its curves gave
    one, else its summary value; every other SPS key's summary value."""
    values = ", ".join(
        f"coalesce(sps_steady, {column})" if key == sps_metric else column for key, column in SPS_KEYS.items()
    )
    keys = ", ".join(f"'{key}'" for key in SPS_KEYS)
    # one row per metric by unnesting the run's values beside their keys: a projection (LATERAL (VALUES ...) was a
    # join DuckDB decorrelates, 0.5 s a tick over the 2 million values of a million-run warehouse)
    return f"""
SELECT * FROM (
    SELECT r.run_id, r.url, r.ci_branch, r.ci_commit, r.ci_config, {testbed_sql()} AS testbed,
           coalesce(r.ci_timestamp, r.created_at) AS ci_at, r.ended_at, unnest([{values}]) AS value,
           unnest([{keys}]) AS metric
    FROM {MIRRORED_RUNS_SQL} r
    WHERE r.ci_branch IS NOT NULL AND r.state IN ('finished', 'crashed')
) WHERE isfinite(value) AND value > 0
"""


def prs_with_runs_ended_since(con, since: datetime) -> set[int]:
    """The PRs (valid per ``ci_identity``) with a run that ended at or after ``since``: those GitHub still hears of."""
    rows = con.execute(
        f"SELECT DISTINCT ci_branch, ci_commit FROM {MIRRORED_RUNS_SQL} r "
        "WHERE ci_branch IS NOT NULL AND ci_branch <> 'main' AND ended_at >= $since",
        {"since": since},
    ).fetchall()
    return {found[0] for branch, commit in rows if not isinstance(found := ci_identity(branch, commit), str)}


def pr_runs_running(con, pr: int, commit: str | None = None) -> int:
    """Runs of PR ``pr`` (of ``commit``: a prefix either way) still running in the warehouse."""
    return con.execute(
        f"SELECT count(*) FROM {MIRRORED_RUNS_SQL} r WHERE ci_branch = $branch AND state = 'running' "
        "AND ($commit IS NULL OR starts_with(ci_commit, $commit) OR starts_with($commit, ci_commit))",
        {"branch": f"pr{pr}", "commit": commit},
    ).fetchone()[0]


#: The PR groups to judge: every one, or (``changed_only``) those whose ended runs differ from the stored verdict's
#: (``pr_checks``; the number and the commit as ``ci_identity`` makes them, so a run it refuses never matches and is
#: counted again each time, as before)
_GROUPS_SQL = """
SELECT ci_branch, commit_key, ci_config, testbed, metric, list(run_id ORDER BY run_id) AS runs FROM pr_values
GROUP BY ALL
"""
_CHANGED_GROUPS_SQL = f"""
SELECT g.* FROM ({_GROUPS_SQL}) g
ANTI JOIN pr_checks c  -- every column NULL-safe: a NULL config equals a NULL config, as the stored verdict keeps it
    ON g.ci_branch = 'pr' || c.pr AND g.commit_key IS NOT DISTINCT FROM c.commit
    AND g.ci_config IS NOT DISTINCT FROM c.config AND g.testbed IS NOT DISTINCT FROM c.testbed
    AND g.metric IS NOT DISTINCT FROM c.metric AND g.runs IS NOT DISTINCT FROM c.pr_runs
"""


def _same_key(a: str, b: str) -> str:
    """SQL true when the rows ``a`` and ``b`` have one key ``(ci_config, testbed, metric)``: a run without a config
    shares the key of another without one."""
    return f"{a}.ci_config IS NOT DISTINCT FROM {b}.ci_config AND {a}.testbed = {b}.testbed AND {a}.metric = {b}.metric"


#: The session's table of the value rows being judged (``_stage_judged_values``), read one key at a time.
_JUDGED_VALUES = "pr_judged_values"


def _stage_judged_values(
    con, sps_metric: str, pr: int | None, changed_only: bool, now: datetime, k: int
) -> list[tuple]:
    """Put the value rows ``iter_judged`` needs in a temporary table: the PR runs of the groups to judge, then (when
    there are any) of main's runs of the same config, testbed and metric only those a baseline can take (a tick
    judges the few groups a new PR run changed, not the whole history); returns their keys ``(config, testbed,
    metric)``, each judged on its own. A group is judged against the last ``k`` main runs (by CI time, then run id)
    ended by its cutoff (``_baselines``); the earliest cutoff of a key's groups bounds what any of them takes
    (``_stage_main_baselines``). At ten million runs a tick staged (and copied out) every main run of a touched key,
    millions of rows, for a few PR groups."""
    if changed_only:  # a read-only snapshot (``pr-check``) judges everything asked for, and creates nothing
        con.execute(PR_CHECKS_SQL)
    values = _metric_values_sql(sps_metric)
    con.execute(  # the PR runs of the groups to judge: at most a new run's few in a steady tick, often none
        f"""
CREATE OR REPLACE TEMP TABLE {_JUDGED_VALUES} AS
WITH pr_values AS (
    SELECT *, lower(ci_commit) AS commit_key FROM ({values})
    WHERE ci_branch <> 'main' AND ($pr IS NULL OR ci_branch = 'pr' || $pr)
),
todo AS ({_CHANGED_GROUPS_SQL if changed_only else _GROUPS_SQL})
SELECT p.* EXCLUDE (commit_key) FROM pr_values p
SEMI JOIN todo t ON p.ci_branch = t.ci_branch AND p.commit_key = t.commit_key
    AND {_same_key("p", "t")}
""",
        {"pr": pr},
    )
    keys = con.execute(f"SELECT DISTINCT ci_config, testbed, metric FROM {_JUDGED_VALUES} ORDER BY ALL").fetchall()
    if not keys:
        return []  # nothing to judge: no baseline to read (a quarter of a second at a million runs)
    _stage_main_baselines(con, values, now, k)
    return keys


#: How far before the earliest cutoff of the staged groups main's runs are looked for first, then further, then in all:
#: a key with ``k`` main runs of CI time within the window ended by its cutoff takes its baseline from there (every run
#: outside is older by CI time). A tick's groups are recent, so the first window nearly always holds their baselines;
#: reading every main run of every touched key took 0.6-0.7 s of a tick at a million runs (1.6 million values).
BASELINE_WINDOWS: tuple[timedelta, ...] = (timedelta(days=3), timedelta(days=30))

_MAIN_PASS = "pr_main_pass"


def _stage_main_baselines(con, values: str, now: datetime, k: int) -> None:
    """Add to the staged value rows main's runs of the staged keys (``ci_config, testbed, metric``) that a baseline can
    take: each key's every main run ended after the earliest cutoff of its groups, and of those ended by it the last
    ``k`` (by CI time, then run id; ties kept), found as a top-k per key. Looked for in each of ``BASELINE_WINDOWS``,
    then in all of main: a pass keeps the keys with ``k`` such runs of CI time within it, the next looks further."""
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {_MAIN_PASS}_keys AS  -- each key's earliest cutoff: main as the PR saw it
        SELECT ci_config, testbed, metric, min(cutoff) AS first_cutoff FROM (
            SELECT ci_config, testbed, metric, least(max(ended_at), $now::TIMESTAMP) AS cutoff FROM {_JUDGED_VALUES}
            GROUP BY ci_branch, lower(ci_commit), ci_config, testbed, metric
        ) GROUP BY ALL""",
        {"now": now},
    )
    for window in (*BASELINE_WINDOWS, None):
        left, earliest = con.execute(f"SELECT count(*), min(first_cutoff) FROM {_MAIN_PASS}_keys").fetchone()
        if not left:
            break  # every key found
        low = None if window is None or earliest is None else earliest - window
        con.execute(  # the keys left: their main runs but those of CI time before the window ended by every cutoff
            f"""CREATE OR REPLACE TEMP TABLE {_MAIN_PASS} AS
            SELECT m.*, c.first_cutoff FROM ({values}) m JOIN {_MAIN_PASS}_keys c ON {_same_key("m", "c")}
            WHERE m.ci_branch = 'main' AND ($low::TIMESTAMP IS NULL
                OR NOT coalesce(m.ci_at < $low::TIMESTAMP AND m.ended_at <= $earliest, false))""",
            {"low": low, "earliest": earliest},
        )
        con.execute(  # each key's k-th last run (CI time, then run id) ended by its cutoff: a top-k, not a sort
            f"""CREATE OR REPLACE TEMP TABLE {_MAIN_PASS}_kth AS
            SELECT c.ci_config, c.testbed, c.metric, list_min(max({{'at': m.ci_at, 'id': m.run_id}}, $k)) AS kth,
                   $low::TIMESTAMP IS NULL OR count(m.run_id) FILTER (WHERE m.ci_at >= $low::TIMESTAMP) >= $k AS found
            FROM {_MAIN_PASS}_keys c LEFT JOIN {_MAIN_PASS} m ON {_same_key("m", "c")}
                AND m.ended_at <= m.first_cutoff
            GROUP BY ALL""",
            {"k": k, "low": low},
        )
        con.execute(
            f"""INSERT INTO {_JUDGED_VALUES}
            SELECT m.* EXCLUDE (first_cutoff) FROM {_MAIN_PASS} m
            JOIN {_MAIN_PASS}_kth b ON {_same_key("m", "b")}
            WHERE b.found AND (m.first_cutoff IS NULL OR coalesce(m.ended_at > m.first_cutoff, true)
                OR {{'at': m.ci_at, 'id': m.run_id}} >= b.kth)"""
        )
        con.execute(
            f"DELETE FROM {_MAIN_PASS}_keys c WHERE EXISTS (SELECT 1 FROM {_MAIN_PASS}_kth b WHERE b.found "
            f"AND {_same_key('b', 'c')})"
        )
    for table in (_MAIN_PASS, f"{_MAIN_PASS}_kth", f"{_MAIN_PASS}_keys"):
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _baselines(main: dict[tuple, list[tuple]], wanted: list[tuple[tuple, datetime]], k: int) -> list[list[tuple]]:
    """For each ``(key, cutoff)`` of ``wanted``: the last ``k`` (by CI time, then run id) of ``main[key]``'s runs that
    had ended by ``cutoff``, oldest first. One sweep per key in end order with a heap of ``k``: O(n log k), where
    scanning and sorting every main run for each PR group took the first tick on a million runs past ten minutes."""
    import heapq

    found: list[list[tuple]] = [[] for _ in wanted]
    by_key: dict[tuple, list[int]] = {}
    for i, (key, _) in enumerate(wanted):
        by_key.setdefault(key, []).append(i)
    for key, indices in by_key.items():
        ended = sorted((r for r in main.get(key, []) if r[3] is not None), key=lambda r: r[3])
        heap: list[tuple] = []
        at = 0
        for i in sorted(indices, key=lambda i: wanted[i][1]):
            while at < len(ended) and ended[at][3] <= wanted[i][1]:
                entry = (ended[at][0], ended[at][1], at)  # CI time, run id; the position keeps ties apart
                heapq.heappush(heap, entry) if len(heap) < k else heapq.heappushpop(heap, entry)
                at += 1
            found[i] = [ended[p] for _, _, p in sorted(heap)]
    return found


def judge_prs(con, now: datetime, sps_metric: str, **options) -> list[dict]:
    """Every PR commit and config with ended runs, judged per metric and testbed (``iter_judged``, whose ``options``
    these are); returns the rows of ``pr_checks`` (not written: ``record_pr_checks``), ordered by PR, commit, config,
    testbed and metric."""
    rows = [row for chunk in iter_judged(con, now, sps_metric, **options) for row in chunk]
    return sorted(rows, key=lambda r: tuple(r[c] for c in PR_CHECKS_KEY))


def iter_judged(
    con,
    now: datetime,
    sps_metric: str,
    repo: str | None = None,
    k: int = 10,
    min_n: int = 5,
    confidence: float = 0.99,
    percent: float | None = None,
    pr: int | None = None,
    min_change_pct: float = 2.0,
    skipped: Counter | None = None,
    changed_only: bool = False,
) -> Iterator[list[dict]]:
    """The verdicts of every PR commit and config with ended runs (``pr``: that PR's alone; ``changed_only``: those
    whose ended runs differ from their stored verdict's: a verdict stands once given, a later main run does not rewrite
    a PR's past check), one config, testbed and metric at a time. The first tick after a backfill judges the history's
    PRs once (521,940 verdicts at a million runs), which held every value and verdict in memory at once (3.2 GiB); a
    caller that records each list as it comes holds one key's. A run whose name fails ``ci_identity`` is skipped, its
    reason counted in ``skipped`` (one per run)."""
    try:
        keys = _stage_judged_values(con, sps_metric, pr, changed_only, now, k)
        yield from _judge_keys(con, keys, now, repo, k, min_n, confidence, percent, pr, min_change_pct, skipped)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {_JUDGED_VALUES}")


def _judge_keys(con, keys, now, repo, k, min_n, confidence, percent, pr, min_change_pct, skipped) -> Iterator[list]:
    """Each of ``keys`` judged from ``con``'s staged value rows (``_stage_judged_values``), one list per key."""
    refused: set[str] = set()  # the runs counted in ``skipped``: once each, whatever their metrics
    for key in keys:
        with _collector_paused():
            rows = _judged_key(con, key, now, repo, k, min_n, confidence, percent, pr, min_change_pct, skipped, refused)
        yield rows


@dataclass(frozen=True)
class Judged:
    """What ``judge_changed`` judged: the verdicts (``pr_checks`` rows in Parquet files; none when nothing was
    judged), how many of each, and of which PRs."""

    verdicts: tuple[Path, ...]
    by_verdict: Counter
    prs: frozenset[int]


@contextmanager
def judge_changed(
    open_warehouse: Callable[[], AbstractContextManager[Any]],
    now: datetime,
    sps_metric: str,
    repo: str | None = None,
    min_change_pct: float = 2.0,
    skipped: Counter | None = None,
    k: int = 10,
    min_n: int = 5,
    confidence: float = 0.99,
    config: dict[str, str] | None = None,
) -> Iterator[Judged]:
    """The verdicts of the PR groups whose ended runs differ from their stored verdict (``iter_judged``'s
    ``changed_only``), judged without holding the warehouse: the value rows are staged under a connection of
    ``open_warehouse()`` and copied out (a Parquet file in a folder of its own, gone when the context ends), then
    judged from that file with no connection to the warehouse open, the verdicts written to files of their own a
    hundred thousand at a time (memory stays one key's values and that many verdicts); ``record_judged`` writes them
    in one transaction. The first tick after a backfill judges the whole history (16 s at a million runs, 265 s at
    ten million) and held the writer that long, past every other writer's lock wait. A run that changed in between
    has its group judged again by the next tick (the runs its verdict was given on differ). ``config``: the in-memory
    database's DuckDB settings (the warehouse connections' memory limit)."""
    with tempfile.TemporaryDirectory(prefix="pr-checks-") as folder:
        values = Path(folder) / "values.parquet"
        with open_warehouse() as con:
            keys = _stage_judged_values(con, sps_metric, None, True, now, k)
            if keys:  # in key order, so reading one key's rows back reads only its row groups
                con.execute(
                    f"COPY (FROM {_JUDGED_VALUES} ORDER BY ci_config, testbed, metric) "
                    f"TO {sql_string(str(values))} (FORMAT parquet)"
                )
            con.execute(f"DROP TABLE {_JUDGED_VALUES}")
        if not keys:  # a steady tick often judges nothing: no file, no judging database
            yield Judged((), Counter(), frozenset())
            return
        by_verdict: Counter = Counter()
        prs: set[int] = set()
        parts: list[Path] = []
        held = 0  # verdicts in the judging database, written out past _VERDICTS_PER_FILE
        with duckdb.connect(config=config or {}) as judging:  # the values read from the file, one key at a time
            judging.execute(f"CREATE VIEW {_JUDGED_VALUES} AS FROM read_parquet({_parquet(values)})")
            judged = _judge_keys(
                judging,
                keys,
                now=now,
                repo=repo,
                k=k,
                min_n=min_n,
                confidence=confidence,
                percent=None,
                pr=None,
                min_change_pct=min_change_pct,
                skipped=skipped,
            )
            pending: list[dict] = []  # verdicts not yet in the judging database: inserted a few thousand at a time
            for rows in judged:
                by_verdict.update(r["verdict"] for r in rows)
                prs.update(r["pr"] for r in rows)
                pending += rows
                if len(pending) >= _VERDICTS_PER_INSERT or held + len(pending) >= _VERDICTS_PER_FILE:
                    record_pr_checks(judging, pending)  # one insert per key cost 20 ms each: 0.4 s a tick at 20 keys
                    held, pending = held + len(pending), []
                if held >= _VERDICTS_PER_FILE:
                    parts.append(_write_out(judging, Path(folder) / f"verdicts-{len(parts)}.parquet"))
                    held = 0
            record_pr_checks(judging, pending)
            held += len(pending)
            if held:
                parts.append(_write_out(judging, Path(folder) / f"verdicts-{len(parts)}.parquet"))
        yield Judged(tuple(parts), by_verdict, frozenset(prs))


#: How many verdicts ``judge_changed`` holds in memory before writing them to a file of their own (the first judging
#: of ten million runs gives 5.2 million).
_VERDICTS_PER_FILE = 100_000
#: ... and how many it gathers (Python objects) before inserting them into the judging database.
_VERDICTS_PER_INSERT = 5_000


def _write_out(judging, path: Path) -> Path:
    """The judging database's verdicts into the Parquet file ``path``, and out of the database."""
    judging.execute(f"COPY pr_checks TO {sql_string(str(path))} (FORMAT parquet)")
    judging.execute("DELETE FROM pr_checks")
    return path


def _parquet(path: Path) -> str:
    """``path`` as ``read_parquet``'s argument, read literally (no glob)."""
    return sql_string(literal_path(str(path)))


def record_judged(con, judged: Judged) -> None:
    """``judge_changed``'s verdicts in place of the stored ones of their groups, in one transaction."""
    con.execute(PR_CHECKS_SQL)
    if judged.verdicts:
        _replace_verdicts(con, f"read_parquet([{', '.join(_parquet(path) for path in judged.verdicts)}])")


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while one key is judged: its rows and verdicts are millions of small
    acyclic objects, and each collection walked every one of them (7 s of the 25 s a million-run history's first
    judging took). Restored as it was, whatever happens."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: One key's value rows: what judging reads (main's runs need no URL nor commit: NULL, fewer Python objects).
_KEY_VALUES_SQL = f"""
SELECT run_id, CASE WHEN ci_branch <> 'main' THEN url END, ci_branch, CASE WHEN ci_branch <> 'main' THEN ci_commit END,
       ci_at, ended_at, value
FROM {_JUDGED_VALUES} WHERE ci_config IS NOT DISTINCT FROM $config AND testbed = $testbed AND metric = $metric
"""


def _judged_key(
    con, key: tuple, now: datetime, repo, k, min_n, confidence, percent, pr, min_change_pct, skipped, refused
) -> list[dict]:
    """The verdicts of one ``(config, testbed, metric)`` (``iter_judged``)."""
    main: list[tuple] = []
    prs: dict[tuple, list[tuple]] = {}
    urls = {}
    params = dict(zip(("config", "testbed", "metric"), key, strict=True))
    for run_id, url, branch, commit, ci_at, ended_at, value in con.execute(_KEY_VALUES_SQL, params).fetchall():
        if branch == "main":
            main.append((ci_at, run_id, value, ended_at))
            continue
        identity = ci_identity(branch, commit)
        if isinstance(identity, str):
            if skipped is not None and run_id not in refused:
                skipped[identity] += 1
            refused.add(run_id)
        elif pr is None or identity[0] == pr:
            prs.setdefault(identity, []).append((ci_at, run_id, value, ended_at))
            urls[run_id] = url
    groups = sorted(prs.items())
    # main as it stood when the sample's last run ended
    wanted = [(key, min(now, max(r[3] for r in runs))) for _, runs in groups]
    return [
        _verdict_row(repo, number, commit, key, runs, history, urls, now, min_n, confidence, percent, min_change_pct)
        for ((number, commit), runs), history in zip(groups, _baselines({key: main}, wanted, k), strict=True)
    ]


def _verdict_row(
    repo, number, commit, key, runs, history, urls, now, min_n, confidence, percent, min_change_pct
) -> dict:
    config, testbed, metric = key
    if testbed == UNKNOWN_TESTBED:  # no GPU count or model: any hardware; never one baseline for all of it
        history = []
    verdict = judge(
        [v for _, _, v, _ in runs], [v for _, _, v, _ in history], min_n, confidence, percent, min_change_pct
    )
    return {
        "repo": repo,
        "pr": number,
        "commit": commit,
        "config": config,
        "testbed": testbed,
        "metric": metric,
        **verdict.__dict__,
        "judged_at": now,
        "pr_runs": sorted(r for _, r, _, _ in runs),
        "baseline_runs": [r for _, r, _, _ in history],
        "pr_run_urls": [urls[r] for r in sorted(r for _, r, _, _ in runs)],
    }


def record_pr_checks(con, rows: list[dict]) -> None:
    """Replace the judged (pr, commit, config, testbed, metric) rows of ``pr_checks`` in one transaction."""
    import pandas

    con.execute(PR_CHECKS_SQL)
    if not rows:
        return
    con.register("judged_prs", pandas.DataFrame(rows, columns=list(PR_CHECKS_COLUMNS)))
    try:
        _replace_verdicts(con, "judged_prs")
    finally:
        con.unregister("judged_prs")


def _replace_verdicts(con, source: str) -> None:
    """The ``pr_checks`` rows of ``source`` (a table or a table function) in place of the stored rows of their
    keys, in one transaction."""
    key = ", ".join(f'"{c}"' for c in PR_CHECKS_KEY)
    with transaction(con):
        con.execute(f"DELETE FROM pr_checks WHERE ({key}) IN (SELECT {key} FROM {source})")
        con.execute(f"INSERT INTO pr_checks BY NAME SELECT * FROM {source}")


def held_verdicts(con, prs: list[int]) -> list[dict]:
    """Every stored verdict of these PRs (what their checks and comments show)."""
    if not prs:
        return []
    return dict_rows(con, "SELECT * FROM pr_checks WHERE list_contains($prs, pr)", {"prs": prs})


def latest_verdicts(con, n: int = 20) -> list[dict]:
    """The ``n`` verdicts judged last (the asset's view in the UI)."""
    con.execute(PR_CHECKS_SQL)
    return dict_rows(con, "SELECT * FROM pr_checks ORDER BY judged_at DESC, pr DESC, config, metric LIMIT $n", {"n": n})


def markdown_cell(text: str) -> str:
    """Text from a run name as one Markdown table cell that does only that: a ``|`` would end the cell, an ``@``
    would notify a GitHub user or team (a zero-width space after it keeps it readable and inert)."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("@", "@\u200b")


def format_pr_table(rows: list[dict], links: bool = False) -> str:
    """The verdicts as a Markdown table (the check's summary, the PR comment, ``pr-check``'s output): config, testbed,
    metric, PR value [runs], baseline median [n], change, boundary, verdict; ``links``: the PR runs' W&B pages."""
    head = "| config | testbed | metric | PR | baseline median [n] | change | boundary | verdict |"
    lines = [head + (" W&B |" if links else ""), "|---" * (9 if links else 8) + "|"]
    for r in rows:
        median = f"{r['baseline_median']:,.1f} [{r['baseline_n']}]" if r["baseline_median"] is not None else "- [0]"
        change = f"{r['change_pct']:+.1f}%" if r["change_pct"] is not None else "-"
        boundary = f"{r['boundary']:,.1f}" if r["boundary"] is not None else "-"
        line = (
            f"| {markdown_cell(r['config'])} | {markdown_cell(r['testbed'])} | {markdown_cell(r['metric'])} | "
            f"{r['pr_value']:,.1f} [{r['pr_n']}] | {median} | "
            f"{change} | {boundary} | {r['verdict']} |"
        )
        if links:
            pages = zip(r["pr_runs"], r.get("pr_run_urls") or [None] * len(r["pr_runs"]), strict=True)
            line += " " + ", ".join(f"[{run}]({url})" if url else run for run, url in pages) + " |"
        lines.append(line)
    return "\n".join(lines)
