"""Run categorisation and CI run-name parsing.

CI benchmark runs are named ``github.sky.<branch>.<commit>.<config>.<ts>`` where ``<branch>`` is ``main``
or ``pr<N>``. ``<config>`` may itself contain dots, so the name is parsed from both ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

PUSH_TO_MAIN = "push_to_main"
SWEEP = "sweep"
REGULAR = "regular"
CATEGORIES = (PUSH_TO_MAIN, SWEEP, REGULAR)

CI_PREFIX = "github.sky."
#: ``main`` or ``pr`` and ASCII digits (``\d`` would take any script's digits); the number's range is judged where it
#: is used (``lib/acting/pr_checks.ci_identity``): a run name is anyone's to choose.
_BRANCH_RE = re.compile(r"^(main|pr[0-9]+)$")


@dataclass(frozen=True)
class CiRunName:
    """The fields encoded in a CI run's display name."""

    branch: str
    commit: str
    config: str
    timestamp: datetime | None
    raw_timestamp: str


def categorize(display_name: str | None, sweep_id: str | None) -> str:
    """Return the run's category; rules are checked in order: push-to-main, sweep, regular."""
    name = display_name or ""
    if name.startswith(CI_PREFIX):
        return PUSH_TO_MAIN
    if sweep_id or ".sweep" in name.lower():
        return SWEEP
    return REGULAR


def parse_ci_timestamp(raw: str) -> datetime | None:
    """Parse the trailing ``<ts>`` of a CI name: epoch seconds/ms, ``YYYYMMDDHHMMSS`` or ISO-ish; UTC."""
    if raw.isdigit():
        try:
            if len(raw) == 14:
                return datetime.strptime(raw, "%Y%m%d%H%M%S").replace(tzinfo=UTC)
            if len(raw) == 13:
                return datetime.fromtimestamp(int(raw) / 1000, tz=UTC)
            if len(raw) == 10:
                return datetime.fromtimestamp(int(raw), tz=UTC)
        except (ValueError, OverflowError):
            return None
        return None
    for fmt in ("%Y%m%dT%H%M%SZ", "%Y%m%dT%H%M%S", "%Y-%m-%dT%H-%M-%S", "%Y%m%d-%H%M%S"):
        try:
            return datetime.strptime(raw, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def parse_ci_name(display_name: str | None) -> CiRunName | None:
    """Parse a ``github.sky.*`` name; None when the name is not a well-formed CI name."""
    if not display_name or not display_name.startswith(CI_PREFIX):
        return None
    parts = display_name[len(CI_PREFIX) :].split(".")
    if len(parts) < 4:
        return None
    branch, commit, *config_parts, raw_ts = parts
    config = ".".join(config_parts)
    if not _BRANCH_RE.match(branch) or not commit or not config:
        return None
    return CiRunName(branch, commit, config, parse_ci_timestamp(raw_ts), raw_ts)
