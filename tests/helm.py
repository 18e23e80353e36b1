"""What Helm does with deploy/helm/values.yaml before and while it renders the official dagster/dagster chart,
redone in Python so CI can check the deployment without helm or a cluster.

The chart's schemas and defaults are copied under tests/fixtures/dagster-helm-chart/ (their README names the
source commits). Three steps are modelled:
- ``merged_values``: the user's file over the chart's defaults (maps merge, lists and scalars from the user
  win, a user ``null`` deletes the key), the parent's ``global`` copied into the subchart's values;
- ``schema_errors``: JSON-schema validation of the parent and of the ``dagster-user-deployments`` subchart
  (the ``$ref``s to Kubernetes definitions on a remote host accept anything offline);
- ``instance_yaml``: the ``dagster.yaml`` the chart's instance ConfigMap renders from those values (templates
  ``configmap-instance.yaml`` and ``helpers/instance/_*.tpl``, the concurrency-aware versions), and
  ``code_server_args`` / ``effective_command``: the container ``args`` the chart gives the code server and
  what a container runs for them given the image's ENTRYPOINT and CMD.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).parent / "fixtures" / "dagster-helm-chart"
SUBCHART = CHART / "charts" / "dagster-user-deployments"
SUBCHART_KEY = "dagster-user-deployments"


def helm_merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of a user file over chart defaults: maps merge key by key, anything else is replaced,
    and a user ``null`` removes the key."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def merged_values(values_file: Path) -> dict:
    """The parent chart's values after merging, with the subchart section merged over the subchart's own
    defaults and the parent's ``global`` copied in (what the subchart's templates see)."""
    user = _load_yaml(values_file)
    values = helm_merge(_load_yaml(CHART / "values.defaults.yaml"), user)
    sub = helm_merge(_load_yaml(SUBCHART / "values.defaults.yaml"), user.get(SUBCHART_KEY) or {})
    sub["global"] = helm_merge(sub.get("global") or {}, values.get("global") or {})
    values[SUBCHART_KEY] = helm_merge(values.get(SUBCHART_KEY) or {}, sub)
    return values


def _offline(schema: Any) -> Any:
    """The schema with every ``$ref`` to a remote host dropped (what it points to is unknown offline, so that
    part accepts anything; sibling keywords such as ``type`` still apply)."""
    if isinstance(schema, dict):
        return {
            k: _offline(v)
            for k, v in schema.items()
            if not (k == "$ref" and str(v).startswith(("http://", "https://")))
        }
    if isinstance(schema, list):
        return [_offline(v) for v in schema]
    return schema


def _validator(schema_path: Path):
    from jsonschema import validators

    schema = _offline(json.loads(schema_path.read_text()))
    return validators.validator_for(schema, default=validators.Draft202012Validator)(schema)


def schema_errors(values: dict) -> list[str]:
    """Every schema violation of the merged values, parent and subchart, as ``path: message`` lines."""
    sub = {k: v for k, v in values[SUBCHART_KEY].items() if k not in ("enabled", "enableSubchart")}
    found = []
    for where, schema, data in (
        ("", CHART / "values.schema.json", values),
        (SUBCHART_KEY, SUBCHART / "values.schema.json", sub),
    ):
        for error in _validator(schema).iter_errors(data):
            path = ".".join(str(p) for p in (([where] if where else []) + list(error.absolute_path)))
            found.append(f"{path or '(top)'}: {error.message}")
    return found


def _postgres_config(values: dict) -> dict:
    pg = values["postgresql"]
    config = {
        "postgres_db": {
            "username": pg["postgresqlUsername"],
            "password": {"env": "DAGSTER_PG_PASSWORD"},
            "hostname": pg["postgresqlHost"] if not pg.get("enabled") else "dagster-postgresql",
            "db_name": pg["postgresqlDatabase"],
            "port": pg["service"]["port"],
            "params": pg.get("postgresqlParams") or {},
        }
    }
    if pg.get("postgresqlScheme"):
        config["postgres_db"]["scheme"] = pg["postgresqlScheme"]
    return config


def _run_coordinator(values: dict) -> dict:
    """``_run-coordinator.tpl``: with ``concurrency.enabled`` the queued coordinator only writes limits set
    explicitly; without it a missing ``maxConcurrentRuns`` is written as -1 (whenever the block has a value)."""
    qrc = values["dagsterDaemon"]["runCoordinator"]["config"].get("queuedRunCoordinator") or {}
    concurrency_enabled = bool((values.get("concurrency") or {}).get("enabled"))
    rendered: dict[str, Any] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}
    if not [v for v in qrc.values() if v not in (None, False, 0, "", [], {})]:
        return rendered
    config: dict[str, Any] = {}
    if not concurrency_enabled or qrc.get("maxConcurrentRuns") is not None:
        config["max_concurrent_runs"] = -1 if qrc.get("maxConcurrentRuns") is None else qrc["maxConcurrentRuns"]
    if qrc.get("tagConcurrencyLimits"):
        config["tag_concurrency_limits"] = qrc["tagConcurrencyLimits"]
    for key, name in (
        ("dequeueIntervalSeconds", "dequeue_interval_seconds"),
        ("dequeueUseThreads", "dequeue_use_threads"),
        ("dequeueNumWorkers", "dequeue_num_workers"),
    ):
        if qrc.get(key):
            config[name] = qrc[key]
    rendered["config"] = config
    return rendered


def _concurrency(values: dict) -> dict | None:
    """``_concurrency.tpl``, including its ``fail`` on limits set in both places."""
    concurrency = values.get("concurrency") or {}
    if not concurrency.get("enabled"):
        return None
    pools, runs = concurrency.get("pools") or {}, concurrency.get("runs") or {}
    qrc = values["dagsterDaemon"]["runCoordinator"]["config"].get("queuedRunCoordinator") or {}
    if runs.get("maxConcurrentRuns") is not None and qrc.get("maxConcurrentRuns") is not None:
        raise ValueError(
            "helm template fails: Cannot set both concurrency.runs.maxConcurrentRuns and "
            "dagsterDaemon.runCoordinator.config.queuedRunCoordinator.maxConcurrentRuns"
        )
    rendered: dict[str, Any] = {}
    if (
        pools.get("defaultLimit") is not None
        or pools.get("granularity")
        or pools.get("opGranularityRunBuffer") is not None
    ):
        rendered["pools"] = {}
        if pools.get("defaultLimit") is not None:
            rendered["pools"]["default_limit"] = pools["defaultLimit"]
        if pools.get("granularity"):
            rendered["pools"]["granularity"] = pools["granularity"]
        if pools.get("opGranularityRunBuffer") is not None:
            rendered["pools"]["op_granularity_run_buffer"] = pools["opGranularityRunBuffer"]
    if runs.get("maxConcurrentRuns") is not None or runs.get("tagConcurrencyLimits"):
        rendered["runs"] = {}
        if runs.get("maxConcurrentRuns") is not None:
            rendered["runs"]["max_concurrent_runs"] = runs["maxConcurrentRuns"]
        if runs.get("tagConcurrencyLimits"):
            rendered["runs"]["tag_concurrency_limits"] = runs["tagConcurrencyLimits"]
    return rendered


def instance_yaml(values: dict, namespace: str = "dagster") -> dict:
    """The ``dagster.yaml`` the chart's instance ConfigMap holds for these (merged) values."""
    daemon = values["dagsterDaemon"]
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    storage = {"config": _postgres_config(values)}
    launcher_config: dict[str, Any] = {
        "load_incluster_config": k8s["loadInclusterConfig"],
        "job_namespace": k8s.get("jobNamespace") or namespace,
        "image_pull_policy": k8s["imagePullPolicy"],
        "service_account_name": values["global"].get("serviceAccountName") or "dagster",
        "dagster_home": {"env": "DAGSTER_HOME"},
        "instance_config_map": {"env": "DAGSTER_K8S_INSTANCE_CONFIG_MAP"},
        "postgres_password_secret": {"env": "DAGSTER_K8S_PG_PASSWORD_SECRET"},
        "env_config_maps": [{"env": "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP"}]
        + [c["name"] for c in k8s.get("envConfigMaps") or [] if "name" in c],
    }
    for key, name in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes")):
        if k8s.get(key):
            launcher_config[name] = k8s[key]
    if k8s.get("envSecrets"):
        launcher_config["env_secrets"] = [s["name"] for s in k8s["envSecrets"] if "name" in s]
    if k8s.get("runK8sConfig"):
        launcher_config["run_k8s_config"] = {
            {"containerConfig": "container_config", "podSpecConfig": "pod_spec_config"}.get(k, k): v
            for k, v in k8s["runK8sConfig"].items()
        }
    rendered: dict[str, Any] = {
        "scheduler": {"module": "dagster._core.scheduler", "class": "DagsterDaemonScheduler"},
        "schedule_storage": {
            "module": "dagster_postgres.schedule_storage",
            "class": "PostgresScheduleStorage",
            **storage,
        },
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher_config},
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage", **storage},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage", **storage},
    }
    if daemon.get("enabled") and daemon["runCoordinator"].get("enabled"):
        rendered["run_coordinator"] = _run_coordinator(values)
    if values["computeLogManager"]["type"] == "NoOpComputeLogManager":
        rendered["compute_logs"] = {
            "module": "dagster._core.storage.noop_compute_log_manager",
            "class": "NoOpComputeLogManager",
        }
    python_logs = values.get("pythonLogs") or {}
    if python_logs:
        rendered["python_logs"] = {}
        if python_logs.get("pythonLogLevel"):
            rendered["python_logs"]["python_log_level"] = python_logs["pythonLogLevel"]
        if python_logs.get("managedPythonLoggers"):
            rendered["python_logs"]["managed_python_loggers"] = python_logs["managedPythonLoggers"]
    monitoring = daemon.get("runMonitoring") or {}
    if daemon.get("enabled") and monitoring.get("enabled"):
        rendered["run_monitoring"] = {
            "enabled": True,
            "start_timeout_seconds": monitoring["startTimeoutSeconds"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
        }
        if monitoring.get("maxResumeRunAttempts"):
            rendered["run_monitoring"]["max_resume_run_attempts"] = monitoring["maxResumeRunAttempts"]
        if monitoring.get("freeSlotsAfterRunEndSeconds"):
            rendered["run_monitoring"]["free_slots_after_run_end_seconds"] = monitoring["freeSlotsAfterRunEndSeconds"]
    retries = daemon.get("runRetries") or {}
    if daemon.get("enabled") and retries.get("enabled"):
        rendered["run_retries"] = {"enabled": True}
        if retries.get("maxRetries"):
            rendered["run_retries"]["max_retries"] = retries["maxRetries"]
    for key in ("sensors", "schedules"):
        block = daemon.get(key) or {}
        if daemon.get("enabled") and block.get("useThreads"):
            rendered[key] = {"use_threads": True}
            if block.get("numWorkers"):
                rendered[key]["num_workers"] = block["numWorkers"]
    rendered["telemetry"] = {"enabled": bool(values["telemetry"]["enabled"])}
    concurrency = _concurrency(values)
    if concurrency is not None:
        rendered["concurrency"] = concurrency
    for key, value in (values.get("additionalInstanceConfig") or {}).items():
        rendered[key] = value
    return rendered


def code_server_args(deployment: dict) -> list[str]:
    """The container ``args`` of a user deployment (``deployment-user.yaml``); the chart sets no ``command``."""
    if deployment.get("dagsterApiGrpcArgs"):
        return [
            "dagster",
            "api",
            "grpc",
            "-h",
            "0.0.0.0",
            "-p",
            str(deployment["port"]),
            *deployment["dagsterApiGrpcArgs"],
        ]
    return [
        "dagster",
        "code-server",
        "start",
        "-h",
        "0.0.0.0",
        "-p",
        str(deployment["port"]),
        *deployment["codeServerArgs"],
    ]


def image_entrypoint_and_cmd(dockerfile: Path) -> tuple[list[str], list[str]]:
    """The exec-form ENTRYPOINT and CMD of the final stage (empty when absent)."""
    text = dockerfile.read_text()
    final = text[text.rfind("\nFROM ") :]

    def exec_form(instruction: str) -> list[str]:
        found = re.findall(rf"^{instruction}\s+(\[.*\])\s*$", final, re.M)
        return json.loads(found[-1]) if found else []

    return exec_form("ENTRYPOINT"), exec_form("CMD")


def effective_command(entrypoint: list[str], cmd: list[str], args: list[str] | None) -> list[str]:
    """What a Kubernetes container runs with no ``command`` set: the image's ENTRYPOINT followed by the pod's
    ``args`` when given (they replace CMD), else ENTRYPOINT followed by CMD."""
    return [*entrypoint, *(args if args is not None else cmd)]
