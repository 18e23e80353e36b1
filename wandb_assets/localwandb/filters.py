"""Mongo-style run filters and orders, as the W&B server applies them to the ``Runs`` query."""

from __future__ import annotations

import re
from typing import Any

from wandb_assets.lib.normalize import lookup_dotted, parse_timestamp

_MISSING = object()
_TIME_FIELDS = {"createdAt", "created_at", "heartbeatAt", "heartbeat_at", "updatedAt"}
_FIELD_ALIASES = {
    "display_name": "displayName",
    "created_at": "createdAt",
    "heartbeat_at": "heartbeatAt",
    "sweep": "sweepName",
    "job_type": "jobType",
}


def field_value(run: dict, field: str) -> Any:
    """Resolve a filter/order field against a run record (node plus decoded config and summary)."""
    if field.startswith("config."):
        key = field[len("config.") :]
        value = lookup_dotted(run["_config"], key)
        if value is None and key.endswith(".value"):
            value = lookup_dotted(run["_config"], key[: -len(".value")])
        return _MISSING if value is None else value
    if field.startswith(("summary_metrics.", "summaryMetrics.")):
        value = lookup_dotted(run["_summary"], field.split(".", 1)[1])
        return _MISSING if value is None else value
    if field == "username":
        return (run["node"].get("user") or {}).get("username", _MISSING)
    node_field = _FIELD_ALIASES.get(field, field)
    if node_field in _TIME_FIELDS:
        return run["_times"].get(node_field) or _MISSING
    return run["node"].get(node_field, _MISSING)


def _coerce(field: str, operand: Any) -> Any:
    if field in _TIME_FIELDS and isinstance(operand, str):
        return parse_timestamp(operand) or operand
    return operand


def _compare(op: str, value: Any, operand: Any) -> bool:
    if op in ("$eq",):
        return value == operand or (isinstance(value, list) and operand in value)
    if op == "$ne":
        return not _compare("$eq", value, operand)
    if op == "$in":
        if isinstance(value, list):
            return any(v in operand for v in value)
        return value in operand
    if op == "$nin":
        return not _compare("$in", value, operand)
    if op == "$all":
        return isinstance(value, list) and all(v in value for v in operand)
    if op == "$regex":
        return isinstance(value, str) and re.search(operand, value) is not None
    if value is _MISSING or value is None:
        return False
    try:
        if op == "$gt":
            return value > operand
        if op == "$gte":
            return value >= operand
        if op == "$lt":
            return value < operand
        if op == "$lte":
            return value <= operand
    except TypeError:
        return False
    raise ValueError(f"unsupported filter operator {op}")


def _match_field(run: dict, field: str, condition: Any) -> bool:
    value = field_value(run, field)
    if isinstance(condition, dict) and condition and all(k.startswith("$") for k in condition):
        for op, operand in condition.items():
            if op == "$exists":
                if (value is not _MISSING and value is not None) != bool(operand):
                    return False
            elif op == "$not":
                if _match_field(run, field, operand):
                    return False
            else:
                operand = [_coerce(field, o) for o in operand] if isinstance(operand, list) else _coerce(field, operand)
                if not _compare(op, None if value is _MISSING else value, operand):
                    return False
        return True
    return _compare("$eq", None if value is _MISSING else value, _coerce(field, condition))


def matches(run: dict, filters: dict) -> bool:
    """Whether a run record satisfies a Mongo-style filter document."""
    for key, condition in filters.items():
        if key == "$and":
            if not all(matches(run, sub) for sub in condition):
                return False
        elif key == "$or":
            if not any(matches(run, sub) for sub in condition):
                return False
        elif key == "$nor":
            if any(matches(run, sub) for sub in condition):
                return False
        elif not _match_field(run, key, condition):
            return False
    return True


def sort_runs(runs: list[dict], order: str | None) -> list[dict]:
    """Order runs by ``+field``/``-field`` (default ``+created_at``); missing values sort last."""
    order = order or "+created_at"
    descending = order.startswith("-")
    field = order.lstrip("+-")
    if field.startswith("config.") and field.endswith(".value"):
        field = field[: -len(".value")]
    present = [(field_value(r, field), r) for r in runs]
    missing = [r for v, r in present if v is _MISSING or v is None]
    valued = [(v, r) for v, r in present if v is not _MISSING and v is not None]
    try:
        valued.sort(key=lambda pair: (pair[0], pair[1]["node"]["name"]), reverse=descending)
    except TypeError:
        valued.sort(key=lambda pair: (str(pair[0]), pair[1]["node"]["name"]), reverse=descending)
    return [r for _, r in valued] + missing
