"""The idle-GPU policy (``WANDB_ASSETS_IDLE_POLICY``) and its ladder: who is told what, and when a run is stopped. No
Dagster, no environment reads, no warehouse: the decisions alone, from an episode and what the ledger already holds.

An idle **episode** of a run is the unbroken time, up to its latest sample, in which at least ``gpu_fraction`` of its
GPUs were below ``idle_gpu_pct`` (``acting/idle_episodes.py`` finds it in the run's own sampled stream). The **ladder**
is a list of steps, each at a number of idle minutes: tell the owner, tell the team, stop the run. Each step acts once
per episode (the ledger, ``idle_actions``, holds what was done); a run that turns busy ends its episode, and the next
one starts the ladder from the beginning. Steps that fall due together (a run idle for 130 minutes when first seen)
act as the last telling step among them alone, and a stop waits ``grace_minutes`` after the owner was first told,
however long the run was idle before anyone looked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from wandb_assets.lib.errors import ConfigError
from wandb_assets.lib.normalize import lookup_dotted

#: Who a step tells: the run's owner (its W&B user, found in Slack), the owner's team (its channel).
OWNER, TEAM = "owner", "team"
AUDIENCES = (OWNER, TEAM)
#: The ledger's other rows of a step: the stop itself, and its Datadog event.
STOP, DATADOG = "stop", "datadog"


@dataclass(frozen=True)
class LadderStep:
    after_minutes: float
    tell: tuple[str, ...] = ()
    stop: bool = False

    def describe(self) -> str:
        what = [f"tell the {' and the '.join(self.tell)}"] if self.tell else []
        return " and ".join([*what, *(["stop the run"] if self.stop else [])])


@dataclass(frozen=True)
class Exemptions:
    users: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()
    #: ``project`` or ``entity/project``
    projects: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset({"interactive"})
    #: dotted config keys: a run whose config holds one with a true value is exempt
    config_keys: tuple[str, ...] = ()


DEFAULT_LADDER = (
    LadderStep(60, (OWNER,)),
    LadderStep(105, (OWNER, TEAM)),
    LadderStep(120, (), True),
)


@dataclass(frozen=True)
class IdlePolicy:
    idle_gpu_pct: float
    gpu_fraction: float = 1.0
    ladder: tuple[LadderStep, ...] = DEFAULT_LADDER
    stop_runs: bool = False
    grace_minutes: float = 15.0
    exempt: Exemptions = field(default_factory=Exemptions)


_FIELDS = ("idle_gpu_pct", "gpu_fraction", "ladder", "stop_runs", "grace_minutes", "exempt")
_EXEMPT_FIELDS = ("users", "teams", "projects", "tags", "config_keys")


def _number(value: Any, name: str, where: str, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if ok and (value > low if low_open else value >= low) and value <= high:
        return float(value)
    bound = f"above {low:g}" if low_open else f"at least {low:g}"
    raise ConfigError(f"{where}: {name} must be a number {bound} and at most {high:g} (got {value!r}).")


def _names(value: Any, name: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{where}: exempt.{name} must be a list of names (got {value!r}).")
    return tuple(v.strip() for v in value)


def _step(entry: Any, index: int, where: str) -> LadderStep:
    if not isinstance(entry, Mapping) or not set(entry) <= {"after_minutes", "tell", "stop"}:
        raise ConfigError(
            f"{where}: ladder step {index} must be such as {{after_minutes: 60, tell: [owner]}} or "
            f"{{after_minutes: 120, stop: true}} (got {entry!r})."
        )
    minutes = _number(entry.get("after_minutes"), f"ladder step {index}'s after_minutes", where, 0, 10**6, True)
    tell = entry.get("tell") or []
    if not isinstance(tell, list) or any(t not in AUDIENCES for t in tell):
        raise ConfigError(f"{where}: ladder step {index} may tell [owner], [team] or [owner, team] (got {tell!r}).")
    stop = entry.get("stop", False)
    if not isinstance(stop, bool):
        raise ConfigError(f"{where}: ladder step {index}'s stop must be true or false (got {stop!r}).")
    if not tell and not stop:
        raise ConfigError(f"{where}: ladder step {index} neither tells anyone nor stops the run.")
    return LadderStep(minutes, tuple(dict.fromkeys(tell)), stop)


def parse_idle_policy(document: Any, where: str, default_idle_pct: float) -> IdlePolicy:
    """The parsed YAML of a policy file (None: an empty file, every default); a ``ConfigError`` of one sentence naming
    ``where`` and the field for anything else."""
    document = {} if document is None else document
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where} must be a mapping such as 'stop_runs: false' (see docs/alerts.md).")
    unknown = [k for k in document if k not in _FIELDS]
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS)}).")
    pct = _number(document.get("idle_gpu_pct", default_idle_pct), "idle_gpu_pct", where, 0, 100)
    fraction = _number(document.get("gpu_fraction", 1.0), "gpu_fraction", where, 0, 1, True)
    grace = _number(document.get("grace_minutes", 15), "grace_minutes", where, 0, 10**6)
    stop_runs = document.get("stop_runs", False)
    if not isinstance(stop_runs, bool):
        raise ConfigError(f"{where}: stop_runs must be true or false (got {stop_runs!r}).")
    ladder_document = document.get("ladder")
    if ladder_document is None:
        ladder = DEFAULT_LADDER
    elif not isinstance(ladder_document, list) or not ladder_document:
        raise ConfigError(f"{where}: ladder must be a list of steps (got {ladder_document!r}).")
    else:
        ladder = tuple(_step(entry, i + 1, where) for i, entry in enumerate(ladder_document))
    stops = [i for i, step in enumerate(ladder) if step.stop]
    if stops and not any(step.tell for step in ladder[: stops[0]]):
        raise ConfigError(f"{where}: ladder step {stops[0] + 1} stops a run nobody was told of: tell first.")
    for i in range(1, len(ladder)):
        if ladder[i].after_minutes <= ladder[i - 1].after_minutes:
            raise ConfigError(f"{where}: ladder step {i + 1} must come after step {i} (after_minutes must grow).")
    exempt_document = document.get("exempt") or {}
    if not isinstance(exempt_document, Mapping) or any(k not in _EXEMPT_FIELDS for k in exempt_document):
        raise ConfigError(f"{where}: exempt may hold {', '.join(_EXEMPT_FIELDS)} (got {exempt_document!r}).")
    names = {k: _names(exempt_document.get(k), k, where) for k in _EXEMPT_FIELDS if k in exempt_document}
    exempt = Exemptions(
        **{k: frozenset(v) for k, v in names.items() if k != "config_keys"},
        **({"config_keys": names["config_keys"]} if "config_keys" in names else {}),
    )
    return IdlePolicy(pct, fraction, ladder, stop_runs, grace, exempt)


def exemption(
    policy: IdlePolicy,
    entity: str,
    project: str,
    user: str | None,
    team: str | None,
    tags: Iterable[str] | None,
    config: Any,
) -> str | None:
    """Why the policy never tells about or stops this run (one phrase), or None."""
    exempt = policy.exempt
    if user and user in exempt.users:
        return f"user {user} is exempt"
    if team and team in exempt.teams:
        return f"team {team} is exempt"
    if project in exempt.projects or f"{entity}/{project}" in exempt.projects:
        return f"project {entity}/{project} is exempt"
    return exempt_by_run(exempt, tags, config)


def exempt_by_run(exempt: Exemptions, tags: Iterable[str] | None, config: Any) -> str | None:
    """Why the run's own tags or config exempt it (one phrase), or None: what its owner can change in W&B at any time,
    so read again when a stop is sent."""
    tagged = sorted(set(tags or ()) & exempt.tags)
    if tagged:
        return f"tagged {tagged[0]}"
    if exempt.config_keys:
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError:
                config = {}
        for key in exempt.config_keys:
            if isinstance(config, Mapping) and lookup_dotted(config, key) not in (None, False, 0, "", "false"):
                return f"config {key} is set"
    return None


@dataclass(frozen=True)
class Done:
    """What the ledger holds of one episode: the steps decided (1-based), and when its owner or team was first told
    (None: not yet, or every message still waits in the outbox)."""

    steps: frozenset[int] = frozenset()
    first_told_at: datetime | None = None


@dataclass(frozen=True)
class Decision:
    """Steps to record now (``act``: acting; ``skip``: due together with a later telling step, which supersedes them),
    and the next step with the time it falls due (None: nothing left)."""

    act: tuple[int, ...] = ()
    skip: tuple[int, ...] = ()
    next_step: int | None = None
    next_at: datetime | None = None


def decide(policy: IdlePolicy, started_at: datetime, latest_at: datetime, now: datetime, done: Done) -> Decision:
    """The steps of ``policy.ladder`` due for an episode idle from ``started_at`` to its latest sample ``latest_at``,
    given what is ``done``. Idle minutes count to ``latest_at`` (what the stream shows), never to ``now``; a stop is
    due only ``grace_minutes`` after the first message to the owner or team went out (``done.first_told_at``, or
    a telling step acting now: then the stop waits for the next tick after the grace)."""
    idle_minutes = (latest_at - started_at).total_seconds() / 60
    due = [i for i, step in enumerate(policy.ladder, 1) if i not in done.steps and step.after_minutes <= idle_minutes]
    act: list[int] = []
    skip: list[int] = []
    told_at = done.first_told_at
    telling_now = False
    blocked_at: int | None = None
    for i in due:
        step = policy.ladder[i - 1]
        if step.stop:
            grace_over = told_at is not None and now >= told_at + timedelta(minutes=policy.grace_minutes)
            if not grace_over:
                blocked_at = i
                break
        act.append(i)
        if step.tell:
            telling_now = True
    # steps due together: the last telling step among those acting speaks for the earlier telling ones
    telling = [i for i in act if policy.ladder[i - 1].tell and not policy.ladder[i - 1].stop]
    if len(telling) > 1:
        skip = telling[:-1]
        act = [i for i in act if i not in skip]
    remaining = [i for i in range(1, len(policy.ladder) + 1) if i not in done.steps and i not in act and i not in skip]
    if not remaining:
        return Decision(tuple(act), tuple(skip))
    following = blocked_at or remaining[0]
    step = policy.ladder[following - 1]
    at = started_at + timedelta(minutes=step.after_minutes)
    if step.stop:
        told = told_at or (now if telling_now else None)
        if told is not None:
            at = max(at, told + timedelta(minutes=policy.grace_minutes))
    return Decision(tuple(act), tuple(skip), following, at)
