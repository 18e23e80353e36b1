"""What a run's GPUs were: how many (and where that number came from), which model, how busy. No Dagster here.

W&B records the GPU count and model of every run in the run file ``wandb-metadata.json`` (``gpu_count``,
``gpu``: "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB"), and the runs query returns ``systemMetrics``, the
run's latest system sample (``system.gpu.<i>.gpu`` = utilisation % of GPU ``i``). People also log the count in
their config under many names. One precedence decides, and the row says which source won:
config keys (``WANDB_ASSETS_GPU_COUNT_KEYS``) -> W&B metadata -> GPU indices in ``systemMetrics`` -> the default.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

#: Where a run's GPU count came from, most trusted first.
SOURCE_CONFIG, SOURCE_METADATA, SOURCE_SYSTEM_METRICS, SOURCE_DEFAULT = (
    "config",
    "metadata",
    "system_metrics",
    "default",
)
GPU_COUNT_SOURCES = (SOURCE_CONFIG, SOURCE_METADATA, SOURCE_SYSTEM_METRICS, SOURCE_DEFAULT)

#: A GPU below this utilisation (percent) in a system sample is idle, unless configured otherwise.
DEFAULT_IDLE_GPU_PCT = 5.0

#: ``system.gpu.<index>.<what>`` in a system-metrics sample (``gpu``: utilisation %, ``memory``: memory busy %).
SYSTEM_GPU_KEY = re.compile(r"^system\.gpu\.([0-9]{1,4})\.([A-Za-z]+)$")  # ASCII digits, an index below MAX_GPUS

#: The most GPUs a count may say one run holds (a larger number is a mistake, counted in the run's anomalies;
#: 4,096 is more than any machine or job W&B has recorded, and far inside the warehouse's INTEGER columns).
MAX_GPUS = 4096
#: The most CPUs a count may say: beyond it the count is a mistake (and would overflow an INTEGER column).
MAX_CPUS = 1 << 20


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """``a.b`` as a flat key or nested objects (``{"a": {"b": 1}}``), or a flat key holding the rest."""
    if dotted in config:
        return config[dotted]
    head, dot, rest = dotted.partition(".")
    if dot and isinstance(config.get(head), Mapping):
        return _lookup(config[head], rest)
    return None


def whole_count(value: Any, minimum: int, maximum: int) -> int | None:
    """A whole count in ``[minimum, maximum]`` from an int, a whole float or a string of ASCII digits; else None
    (``"²"`` passes ``str.isdigit`` and fails ``int``; NaN, booleans and containers are no count). The one count
    rule of GPU and CPU counts, from config, metadata and offline logs alike."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 18:
            return None
        value = int(text)
    elif isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            return None
        value = int(value)
    return value if isinstance(value, int) and minimum <= value <= maximum else None


def valid_gpu_count(value: Any) -> int | None:
    """A whole GPU count, 1 to ``MAX_GPUS``; else None."""
    return whole_count(value, 1, MAX_GPUS)


#: ``system.gpu.<index>.<what>`` keys already read, as ``(index, what)`` (None: not such a key). The same few dozen
#: keys recur in every run's sample: a dictionary lookup instead of a regex and two groups each time.
_GPU_KEYS: dict[str, tuple[int, str] | None] = {}
_GPU_KEYS_MAX = 4096


def _gpu_key(key: str) -> tuple[int, str] | None:
    match = SYSTEM_GPU_KEY.match(key)
    parts = (int(match.group(1)), match.group(2)) if match else None
    if len(_GPU_KEYS) < _GPU_KEYS_MAX:
        _GPU_KEYS[key] = parts
    return parts


def system_gpus(system_metrics: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """``{gpu index: {"gpu": util %, "memory": memory %, ...}}`` from one system-metrics sample (finite numbers
    only); an empty dict when the sample names no GPU."""
    gpus: dict[int, dict[str, float]] = {}
    for key, value in system_metrics.items():
        if not key.startswith("system.gpu."):  # most of a sample: CPU, memory, disk, network (no regex for those)
            continue
        parts = _GPU_KEYS[key] if key in _GPU_KEYS else _gpu_key(key)
        if parts is None or value.__class__ not in (int, float):  # bool (an int subclass) is not a reading
            continue
        try:
            reading = float(value)
        except OverflowError:  # an integer too large for a float (JSON allows any length): no reading
            continue
        if reading != reading or reading in (float("inf"), float("-inf")):
            continue
        gpus.setdefault(parts[0], {})[parts[1]] = reading
    return gpus


def gpu_sample(system_metrics: Mapping[str, Any], found: dict[int, dict[str, float]] | None = None) -> list[dict]:
    """The run's GPUs in one system sample, ``[{gpu_index, utilisation, memory}]`` by index (a GPU whose
    utilisation the sample lacks is left out: it cannot be judged idle or busy). ``found``: ``system_gpus`` of
    the sample, when the caller has it already."""
    return [
        {"gpu_index": index, "utilisation": values["gpu"], "memory": values.get("memory")}
        for index, values in sorted((system_gpus(system_metrics) if found is None else found).items())
        if "gpu" in values
    ]


def mean_utilisation(
    system_metrics: Mapping[str, Any], found: dict[int, dict[str, float]] | None = None
) -> float | None:
    """The mean of ``system.gpu.<i>.gpu`` over the run's GPUs in the sample; None when it has none (``found``:
    as for ``gpu_sample``)."""
    gpus = system_gpus(system_metrics) if found is None else found
    values = [gpu["gpu"] for gpu in gpus.values() if "gpu" in gpu]
    return sum(values) / len(values) if values else None


def gpu_count(
    config: Mapping[str, Any],
    metadata: Mapping[str, Any] | None,
    system_metrics: Mapping[str, Any],
    keys: Iterable[str],
    default: int,
    found: dict[int, dict[str, float]] | None = None,
) -> tuple[int, str, bool]:
    """``(count, source, malformed)``: the first of the config ``keys`` holding a positive whole number, else the
    metadata's ``gpu_count``, else the number of distinct GPU indices in ``system_metrics``, else ``default``.
    ``malformed``: a config key was present but held no usable count (the run's ``anomalies`` says so). ``found``:
    as for ``gpu_sample``."""
    malformed = False
    for key in keys:
        raw = _lookup(config, key)
        if raw is None:
            continue
        count = valid_gpu_count(raw)
        if count is not None:
            return count, SOURCE_CONFIG, malformed
        malformed = True
    from_metadata = valid_gpu_count((metadata or {}).get("gpu_count"))
    if from_metadata is not None:
        return from_metadata, SOURCE_METADATA, malformed
    indices = system_gpus(system_metrics) if found is None else found
    if indices:
        return len(indices), SOURCE_SYSTEM_METRICS, malformed
    return default, SOURCE_DEFAULT, malformed


# ------------------------------------------------------------------------------------------------ GPU models

#: (pattern over the upper-cased name without vendor words, canonical name), first match wins. Memory sizes
#: come from the string where W&B records them (A100 40/80 GB, V100 16/32 GB), else the model's only size.
_MODELS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"\bGH200\b", "GH200"),
        (r"\bH200\b", "H200-141GB"),
        (r"\bH100\b.*(\bNVL\b|\b94\s?GB\b)", "H100-94GB"),
        (r"\bH100\b", "H100-80GB"),
        (r"\bH800\b", "H800-80GB"),
        (r"\bB200\b", "B200"),
        (r"\bA100\b.*\b80\s?GB\b", "A100-80GB"),
        (r"\bA100\b.*\b40\s?GB\b", "A100-40GB"),
        (r"\bA100\b", "A100"),
        (r"\bA800\b.*\b80\s?GB\b", "A800-80GB"),
        (r"\bV100\b.*\b32\s?GB\b", "V100-32GB"),
        (r"\bV100\b.*\b16\s?GB\b", "V100-16GB"),
        (r"\bV100\b", "V100"),
        (r"\bP100\b.*\b12\s?GB\b", "P100-12GB"),
        (r"\bP100\b", "P100-16GB"),
        (r"\bL40S\b", "L40S"),
        (r"\bL40\b", "L40"),
        (r"\bL4\b", "L4"),
        (r"\bA10G\b", "A10G"),
        (r"\bA10\b", "A10"),
        (r"\bA30\b", "A30"),
        (r"\bA40\b", "A40"),
        (r"\bT4\b", "T4"),
        (r"\bK80\b", "K80"),
        (r"\bP4\b", "P4"),
        (r"\bRTX[\s-]+A(\d{4})\b", r"RTX-A\1"),
        (r"\bRTX[\s-]+(\d{4})[\s-]+ADA\b", r"RTX-\1-Ada"),
        (r"\bRTX[\s-]+(\d{4})\s*TI\b", r"RTX-\1Ti"),
        (r"\bRTX[\s-]+(\d{4})\b", r"RTX-\1"),
        (r"\bGTX[\s-]+(\d{3,4})\s*TI\b", r"GTX-\1Ti"),
        (r"\bGTX[\s-]+(\d{3,4})\b", r"GTX-\1"),
        (r"\bTITAN[\s-]+(RTX|V|XP|X)\b", r"TITAN-\1"),
        (r"\bMI(\d{3}[A-Z]?)\b", r"MI\1"),
    )
)
_VENDOR_WORDS = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|AMD|INSTINCT|CORPORATION|GRAPHICS)\b")


def canonical_gpu_model(raw: Any) -> tuple[str | None, bool]:
    """``(name, known)``: a canonical GPU model such as ``H100-80GB``, ``A100-40GB``, ``V100-16GB``,
    ``RTX-4090`` or ``T4`` from the string W&B records, with ``known`` True; an unknown string is kept as it is
    (trimmed) with ``known`` False; nothing (None, empty, not a string) is ``(None, True)``."""
    if not isinstance(raw, str) or not raw.strip():
        return None, True
    text = raw.strip()
    upper = _VENDOR_WORDS.sub(" ", text.upper().replace("_", " "))
    for pattern, name in _MODELS:
        match = pattern.search(upper)
        if match:
            return match.expand(name), True
    return text, False


# ------------------------------------------------------------------------------------------------ testbeds


#: The testbed of a run without a GPU count or model.
UNKNOWN_TESTBED = "unknown"


def testbed_sql(runs: str = "r") -> str:
    """A run's testbed as SQL: its GPU count and model (``8xH100-80GB``), ``unknown`` without either. Throughput is
    compared within a testbed only: the PR checks' baseline, and each main series of the SPS regression detector."""
    return (
        f"CASE WHEN {runs}.gpu_count > 0 AND {runs}.gpu_model IS NOT NULL "
        f"THEN {runs}.gpu_count || 'x' || {runs}.gpu_model ELSE '{UNKNOWN_TESTBED}' END"
    )


#: The most of a ``wandb-metadata.json`` read, from W&B or beside an offline log (the file is a few KB; a bigger one
#: is not what it should be).
METADATA_MAX_BYTES = 4 * 1024 * 1024


#: A run's ``wandb-metadata.json`` found missing or malformed is asked again while its run ended less than this long
#: ago: the client uploads its files at the end, and a file can land after W&B marks the run ended.
METADATA_SETTLE = 24 * 3600.0
#: A read that costs a download and failed (the network or W&B's storage: ``error``; a file that is not JSON, such
#: as a truncated upload or a proxy's HTML error page served with 200: ``malformed``) is made this many times at most
#: in all, each after the wait here since the one before (an hour, then six): then what was found is final, kept with
#: its cause (``costs`` counts such runs by cause).
METADATA_ATTEMPTS = 3
METADATA_BACKOFF_S = (3600.0, 6 * 3600.0)
#: What a failed or unfinished read keeps (besides its status): its cause, how many reads were made, the last when.
_FAILED = ("missing", "malformed", "error")


def metadata_settled(known: Mapping[str, Any] | None, heartbeat: datetime | None, now: datetime) -> bool:
    """Whether a run's metadata file is not to be asked for now (naive UTC): read (or refused) is final; missing (the
    page says so: asking costs nothing) is asked until the run's last heartbeat is ``METADATA_SETTLE`` old; a read
    that failed or found it malformed is asked again only after its back-off (``METADATA_BACKOFF_S`` since the last
    read) and at most ``METADATA_ATTEMPTS`` times in all, and a malformed one no more once the heartbeat is
    ``METADATA_SETTLE`` old; never read: asked."""
    if not known:
        return False
    status = known.get("status")
    if status not in _FAILED:
        return True
    old = heartbeat is not None and (now - heartbeat).total_seconds() >= METADATA_SETTLE
    if status == "missing" or (status == "malformed" and old):
        return old
    attempts = int(known.get("attempts") or 1)
    if attempts >= METADATA_ATTEMPTS:
        return True
    asked = known.get("asked_at")
    if asked is None:  # kept before attempts were counted
        return False
    wait = METADATA_BACKOFF_S[min(attempts, len(METADATA_BACKOFF_S)) - 1]
    return (now - datetime.fromisoformat(asked)).total_seconds() < wait


def metadata_after_reading(
    known: Mapping[str, Any] | None, read: Mapping[str, Any] | None, at: datetime
) -> dict[str, Any] | None:
    """What to keep of a run's metadata file after a fetch at ``at``: not asked (``read`` None), what was kept; read,
    what was read; a failed read (the network), what was found before if it was a file's content, else the failure's
    cause (never its message: it may hold a URL); either counting the read (``attempts``, ``asked_at``) for
    ``metadata_settled``."""
    if read is None:
        return dict(known) if known else None
    if read.get("status") not in _FAILED:
        return dict(read)
    if known and known.get("status") not in _FAILED:
        return dict(known)  # a read made before stays
    attempts = int((known or {}).get("attempts") or (1 if known else 0)) + 1
    if read["status"] == "error":
        kept = known if known and known.get("status") in ("missing", "malformed") else None
        base = dict(kept) if kept else {"status": "error", "cause": read.get("cause")}
    else:
        base = dict(read)
    if base.get("status") == "missing":
        return base  # free to ask again: nothing to count
    return {**base, "attempts": attempts, "asked_at": at.isoformat(sep=" ")}


def machine_metadata(raw: bytes | str) -> dict[str, Any]:
    """What a ``wandb-metadata.json`` says about the machine: ``{"status": "read", "gpu_count", "gpu"}``, or
    ``{"status": "malformed"}`` when it is not a JSON object (W&B's copy and the offline client's alike)."""
    try:
        document = json.loads(raw)
    except ValueError:
        return {"status": "malformed"}
    if not isinstance(document, dict):
        return {"status": "malformed"}
    return {"status": "read", "gpu_count": document.get("gpu_count"), "gpu": document.get("gpu")}
