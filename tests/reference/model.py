"""The reference model of GPU accounting: plain Python, no SQL, no code shared with ``wandb_assets.lib``, slow and
obviously right. It states the rules of docs/gpu-accounting.md ("The rules every number follows") once more, from
what an organisation's history says of each run, so the warehouse can be checked against it.

Input: one ``Copy`` per run and project the warehouse should hold (a run moved between projects has one copy per
project it was seen in; only the copy where W&B holds it now occupies GPUs), the time ``now`` the tables were
computed at, and what the price file said each time the pipeline read it. Output: per (UTC day, entity, project, user,
team, GPU model) the GPU-hours, idle and partly idle GPU-hours and dollars at the price in force that day for the run's
cluster; and the booked ledger (``ledger``), which the chargeback sums by month: open months as used, closed months
as recorded when they were closed, and what changed in a closed month since as adjustments in the first open month
after it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from fnmatch import fnmatchcase

ENDED = ("finished", "failed", "crashed", "killed", "preempted")
FAILED = ("failed", "crashed")
BUSY = ("running", "preempting")
#: A sample holds at most the longer of this and twice its stream's sampling interval.
MIN_HOLD = timedelta(hours=1)


@dataclass
class Copy:
    """What the warehouse should hold of one run in one project."""

    entity: str
    project: str
    run_id: str
    user: str
    gpu_model: str | None
    gpu_count: int
    created_at: datetime
    #: finished, failed, crashed, running, pending; ``vanished`` (W&B stopped answering for it while it was alive, or
    #: its project left the mirror set); ``moved`` (W&B holds it in another project now).
    state: str
    ended_at: datetime | None = None
    #: The last heartbeat the pipeline saw (a vanished copy occupies its GPUs up to it).
    last_seen: datetime | None = None
    #: The GPU stream that counts for idle time: ``(taken at, [utilisation % of each GPU])``, in any order.
    samples: list[tuple[datetime, list[float]]] = field(default_factory=list)
    #: The stream's sampling interval (None: the median gap between its samples).
    interval: timedelta | None = None
    #: The host it ran on (config ``system.hostname``): a price may match it.
    host: str | None = None


def busy_span(run: Copy, now: datetime) -> tuple[datetime, datetime] | None:
    """When the run occupies its GPUs, seen at ``now``; None when it occupies nothing."""
    if run.state in ENDED:
        end = run.ended_at
    elif run.state in BUSY:
        end = now
    elif run.state == "vanished":
        end = min(run.last_seen, now) if run.last_seen else None
    else:  # pending, moved
        end = None
    if end is None or end <= run.created_at:
        return None
    return run.created_at, end


def by_day(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """``[(UTC day, hours of [start, end) on that day)]``."""
    parts = []
    moment = start
    while moment < end:
        midnight = datetime(moment.year, moment.month, moment.day) + timedelta(days=1)
        stop = min(end, midnight)
        parts.append((moment.date(), (stop - moment).total_seconds() / 3600.0))
        moment = stop
    return parts


def holds(run: Copy, now: datetime, idle_pct: float) -> list[tuple[datetime, datetime, float, float]]:
    """``[(taken, until, idle GPUs, partly idle GPUs)]`` of a run's samples, seen at ``now``: each held until the next
    sample, the run's end or now, at most the longer of an hour and twice the stream's sampling interval."""
    span = busy_span(run, now)
    if span is None:
        return []
    samples = sorted((t, u) for t, u in run.samples if span[0] <= t <= now)
    times = [t for t, _ in samples]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    interval = run.interval.total_seconds() if run.interval else (statistics.median(gaps) if gaps else 0.0)
    longest = max(MIN_HOLD.total_seconds(), 2 * interval)
    found = []
    for i, (taken, utilisation) in enumerate(samples):
        until = min(times[i + 1] if i + 1 < len(times) else span[1], span[1], now, taken + timedelta(seconds=longest))
        idle = sum(1 for u in utilisation if u < idle_pct)
        busy = len(utilisation) - idle
        if utilisation and len(utilisation) > run.gpu_count:
            idle = idle * run.gpu_count / len(utilisation)
        if until > taken:
            found.append((taken, until, idle, idle if busy else 0))
    return found


def idle_by_day(run: Copy, now: datetime, idle_pct: float) -> dict[date, tuple[float, float]]:
    """``{day: (idle GPU-hours, partly idle GPU-hours)}`` of a run from its samples' holds (``holds``)."""
    found: dict[date, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for taken, until, idle, partly in holds(run, now, idle_pct):
        for day, hours in by_day(taken, until):
            found[day][0] += idle * hours
            found[day][1] += partly * hours
    return {day: (v[0], v[1]) for day, v in found.items()}


@dataclass
class Usage:
    gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    partly_idle_gpu_hours: float = 0.0
    failed_gpu_hours: float = 0.0
    cost_usd: float | None = None
    idle_cost_usd: float | None = None
    failed_cost_usd: float | None = None


#: What the price file said, in the order the pipeline saw it: ``(first day, {model: prices}, fallback)``, the first
#: entry since always (``None``), each later one from the UTC day it was first seen. A model's prices are a number
#: (since always) or the file's list of periods: ``{"usd": 2.49}``, with an optional ``"from"`` (a ``date``) and an
#: optional ``"hosts"`` glob on the run's hostname.
PriceHistory = list[tuple[date | None, dict, float | None]]


def _periods(value) -> list[dict]:
    return value if isinstance(value, list) else [{"usd": value}]


def price_on(model: str | None, host: str | None, history: PriceHistory, day: date) -> tuple[float | None, str | None]:
    """``(USD per GPU-hour, the rule that priced it)`` of a GPU-hour used on ``day`` by a run of ``model`` on ``host``:
    of the model's hosts rules that match the host and have a price in force that day, the first in the file; else its
    unmatched price; else the fallback; else ``(None, None)`` (unpriced: never 0). A rule's price in force on a day:
    its latest dated period from on or before it, in the file as last read (a dated period says what it says, also of
    the past); before its first one, its undated price in the last file read on or before that day (an edit takes
    effect from the day it was first seen; absent there: none)."""
    if not history:
        return None, None
    seen = [entry for entry in history if entry[0] is None or entry[0] <= day]
    latest = history[-1][1].get(model, []) if model is not None else []
    then = seen[-1][1].get(model, []) if seen and model is not None else []
    hosts = [p["hosts"] for p in _periods(latest) + _periods(then) if "hosts" in p]
    for rule in [*dict.fromkeys(hosts), None]:  # the matched rules in the file's order, the unmatched one last
        if rule is not None and (host is None or not fnmatchcase(host, rule)):
            continue
        dated = sorted((p["from"], p["usd"]) for p in _periods(latest) if p.get("hosts") == rule and "from" in p)
        in_force = [usd for start, usd in dated if start <= day]
        if in_force:
            usd = in_force[-1]
        else:
            undated = [p["usd"] for p in _periods(then) if p.get("hosts") == rule and "from" not in p]
            usd = undated[0] if undated else None
        if usd is not None:
            return float(usd), "list" if rule is None else f"hosts {rule}"
    fallback = seen[-1][2] if seen else None
    return (fallback, "fallback") if fallback is not None else (None, None)


def usd_per_gpu_hour(model: str | None, history: PriceHistory, day: date, host: str | None = None) -> float | None:
    """The price in force on ``day`` (``price_on``)."""
    return price_on(model, host, history, day)[0]


def usage_by_price(
    runs: list[Copy],
    now: datetime,
    prices: PriceHistory,
    teams: dict[str, str],
    idle_pct: float,
) -> dict[tuple, Usage]:
    """Per ``(day, entity, project, user, team, gpu_model, price rule, USD per GPU-hour)``: GPU-hours, idle, partly
    idle and failed GPU-hours, and their dollars at that price (None when unpriced)."""
    usage: dict[tuple, Usage] = defaultdict(Usage)
    for run in runs:
        span = busy_span(run, now)
        if span is None:
            continue
        idle = idle_by_day(run, now, idle_pct)
        for day, hours in by_day(*span):
            price, rule = price_on(run.gpu_model, run.host, prices, day)
            team = teams.get(run.user, "unassigned")
            row = usage[(day, run.entity, run.project, run.user, team, run.gpu_model, rule, price)]
            gpu_hours = run.gpu_count * hours
            row.gpu_hours += gpu_hours
            row.idle_gpu_hours += idle.get(day, (0.0, 0.0))[0]
            row.partly_idle_gpu_hours += idle.get(day, (0.0, 0.0))[1]
            if run.state in FAILED:
                row.failed_gpu_hours += gpu_hours
            if price is not None:
                row.cost_usd = row.gpu_hours * price
                row.idle_cost_usd = row.idle_gpu_hours * price
                row.failed_cost_usd = row.failed_gpu_hours * price
    return dict(usage)


def _add(total: float | None, amount: float | None) -> float | None:
    """A sum of dollars that stays None while nothing in it is priced."""
    return total if amount is None else (total or 0.0) + amount


def gpu_usage(
    runs: list[Copy],
    now: datetime,
    prices: PriceHistory,
    teams: dict[str, str],
    idle_pct: float,
) -> dict[tuple, Usage]:
    """Per ``(day, entity, project, user, team, gpu_model)``: GPU-hours, idle, partly idle and failed GPU-hours, and
    their dollars at the price in force that day for each run's cluster (None when none is priced)."""
    usage: dict[tuple, Usage] = defaultdict(Usage)
    for key, part in usage_by_price(runs, now, prices, teams, idle_pct).items():
        row = usage[key[:6]]
        row.gpu_hours += part.gpu_hours
        row.idle_gpu_hours += part.idle_gpu_hours
        row.partly_idle_gpu_hours += part.partly_idle_gpu_hours
        row.failed_gpu_hours += part.failed_gpu_hours
        row.cost_usd = _add(row.cost_usd, part.cost_usd)
        row.idle_cost_usd = _add(row.idle_cost_usd, part.idle_cost_usd)
        row.failed_cost_usd = _add(row.failed_cost_usd, part.failed_cost_usd)
    return dict(usage)


#: A ledger row's amounts, in this order: GPU-hours, dollars, idle GPU-hours, idle dollars, failed GPU-hours, failed
#: dollars (dollars None when unpriced).
AMOUNTS = ("gpu_hours", "cost_usd", "idle_gpu_hours", "idle_cost_usd", "failed_gpu_hours", "failed_cost_usd")
#: An adjustment smaller than this in every amount is none (a sum computed again).
EPSILON = 1e-6

#: What a closed month's record holds: its ledger rows when it was closed, ``{ledger key: amounts}``.
Records = dict[date, dict[tuple, list]]


def _month(day: date) -> date:
    return day.replace(day=1)


def _next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def _no_amounts() -> list:
    """``AMOUNTS`` of nothing: no hours, dollars not priced."""
    return [0.0, None, 0.0, None, 0.0, None]


def _accumulate(total: list, amounts: list) -> None:
    """Add ``amounts`` into ``total`` (both in ``AMOUNTS`` order): hours add, dollars add as ``_add``."""
    for i, value in enumerate(amounts):
        total[i] = _add(total[i], value) if i % 2 else total[i] + value


def ledger(usage: dict[tuple, Usage], records: Records) -> dict[tuple, list]:
    """The booked ledger from ``usage_by_price`` and the closed months' records: per ``(booked month, category,
    adjustment_of, team, entity, project, user, gpu_model, price rule, USD per GPU-hour)`` the ``AMOUNTS``. An open
    month: its usage (``usage``). A closed month: its record, as it was. What a closed month's usage holds now and its
    records (its own rows and the adjustments of it) do not: an ``adjustment`` of it, booked to the first month after
    it that is not closed (dollars None where neither held a price)."""
    months: dict[date, dict[tuple, list]] = defaultdict(dict)
    for (day, entity, project, user, team, model, rule, price), row in usage.items():
        key = (team, entity, project, user, model, rule, price)
        _accumulate(months[_month(day)].setdefault(key, _no_amounts()), [getattr(row, name) for name in AMOUNTS])
    booked: dict[tuple, list] = {}
    for month, keys in months.items():
        if month not in records:
            booked.update({(month, "usage", None, *key): amounts for key, amounts in keys.items()})
    for record in records.values():
        booked.update(record)
    for closed in sorted(records):
        book = _next_month(closed)
        while book in records:
            book = _next_month(book)
        recorded: dict[tuple, list] = defaultdict(_no_amounts)
        for record in records.values():
            for (month, _, adjustment_of, *key), amounts in record.items():
                if (adjustment_of or month) == closed:
                    _accumulate(recorded[tuple(key)], amounts)
        now = months.get(closed, {})
        for key in {*now, *recorded}:
            was = recorded.get(key) or _no_amounts()
            is_ = now.get(key) or _no_amounts()
            unpriced = was[1] is None and is_[1] is None
            change = [
                (None if unpriced else (is_[i] or 0.0) - (was[i] or 0.0)) if i % 2 else is_[i] - was[i]
                for i in range(len(AMOUNTS))
            ]
            if any(abs(v or 0.0) > EPSILON for v in change):
                booked[(book, "adjustment", closed, *key)] = change
    return booked


def close(usage: dict[tuple, Usage], records: Records, month: date) -> dict[tuple, list]:
    """The record of ``month`` closed now: its rows of the ledger."""
    return {key: list(amounts) for key, amounts in ledger(usage, records).items() if key[0] == month}


def gpu_gauges_24h(runs: list[Copy], at: datetime, prices: PriceHistory, idle_pct: float) -> dict[str, float | None]:
    """The GPU gauges of a snapshot taken ``at`` (the 24 hours before it) over ``runs``, the copies of the projects
    mirrored then: GPU-hours in the window, their dollars (None when GPU-hours in it have no price and none has one;
    0 with no GPU-hours; at the prices in force on the snapshot's day), the unpriced GPU-hours, and the idle GPU-hours
    held in the window (a run's curves' stream once read, ``Copy.samples``; a run the ticks sampled no system metrics
    of, and whose curves are not read, none)."""
    start = at - timedelta(hours=24)
    hours = priced = unpriced = usd = idle_hours = 0.0
    for run in runs:
        span = busy_span(run, at)
        if span is None:
            continue
        for taken, until, idle, _ in holds(run, at, idle_pct):
            idle_hours += idle * max((min(until, at) - max(taken, start)).total_seconds() / 3600.0, 0.0)
        inside = (min(span[1], at) - max(span[0], start)).total_seconds() / 3600.0
        if inside <= 0:
            continue
        gpu_hours = run.gpu_count * inside
        hours += gpu_hours
        price = usd_per_gpu_hour(run.gpu_model, prices, at.date(), run.host)
        if price is None:
            unpriced += gpu_hours
        else:
            priced += gpu_hours
            usd += gpu_hours * price
    return {
        "wandb.training.total_gpu_hours_24h": hours,
        "wandb.gpu.cost_usd_24h": usd if priced else (None if unpriced else 0.0),
        "wandb.gpu.unpriced_gpu_hours_24h": unpriced,
        "wandb.gpu.idle_gpu_hours_24h": idle_hours,
    }
