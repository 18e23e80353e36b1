"""The Kubernetes deployment, checked without helm or a cluster: deploy/helm/values.yaml merged over the
official chart's defaults as Helm does and validated against its schemas, the dagster.yaml those values imply
accepted by Dagster's own instance-config validation, and the image's command line run with the args the chart
and the K8sRunLauncher give it (see tests/helm.py for what is modelled)."""

import gzip
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, free_port, stop_process_group
from tests.helm import (
    code_server_args,
    effective_command,
    image_entrypoint_and_cmd,
    instance_yaml,
    merged_values,
    schema_errors,
)

VALUES = REPO / "deploy" / "helm" / "values.yaml"


def _user_deployment(values: dict) -> dict:
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return deployment


def _edited_values(tmp_path: Path, edit) -> Path:
    user = yaml.safe_load(VALUES.read_text())
    edit(user)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(user))
    return path


def _load_instance_config(tmp_path: Path, rendered: dict):
    """Dagster's own loading of an instance folder's dagster.yaml: schema, `concurrency` rules, then each
    configurable class's config that can be imported here (dagster_k8s is not installed: its class config is
    checked by the instance schema only)."""
    from dagster import DagsterInvalidConfigError
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes.config_class import class_from_code_pointer

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(rendered))
    config, _ = dagster_instance_config(str(home))
    for section in (
        "scheduler",
        "run_coordinator",
        "run_storage",
        "event_log_storage",
        "schedule_storage",
        "compute_logs",
    ):
        block = config[section]
        module = block["module"].replace("dagster.core.", "dagster._core.")
        cls = class_from_code_pointer(module, block["class"])
        checked = validate_config(cls.config_type(), block.get("config") or {})
        if not checked.success:
            raise DagsterInvalidConfigError(f"{section} config", checked.errors, block.get("config"))
    return config


def test_the_helm_values_validate_against_the_chart_and_subchart_schemas():
    assert schema_errors(merged_values(VALUES)) == []


def test_the_schema_check_refuses_a_daemon_replica_count(tmp_path):
    """What the first values file had: `dagsterDaemon.replicaCount`, which `helm install` rejects."""
    bad = _edited_values(tmp_path, lambda v: v["dagsterDaemon"].update(replicaCount=1))
    errors = schema_errors(merged_values(bad))
    assert len(errors) == 1 and errors[0].startswith("dagsterDaemon: Additional properties are not allowed")
    assert "'replicaCount' was unexpected" in errors[0]


def test_the_instance_the_values_imply_is_accepted_by_dagster(tmp_path):
    rendered = instance_yaml(merged_values(VALUES))
    config = _load_instance_config(tmp_path, rendered)
    assert config["concurrency"] == {"pools": {"default_limit": 1}, "runs": {"max_concurrent_runs": 4}}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert "max_concurrent_runs" not in config["run_coordinator"]["config"]
    assert config["run_monitoring"] == {
        "enabled": True,
        "start_timeout_seconds": 300,
        "poll_interval_seconds": 30,
        "free_slots_after_run_end_seconds": 60,
    }
    assert config["python_logs"] == {"python_log_level": "INFO"}
    pg = config["run_storage"]["config"]["postgres_db"]
    assert (pg["hostname"], pg["username"], pg["db_name"], pg["password"]) == (
        "dagster-db.internal",
        "dagster",
        "dagster",
        {"env": "DAGSTER_PG_PASSWORD"},
    )


def test_dagster_refuses_the_first_values_files_concurrency_shape(tmp_path):
    """`additionalInstanceConfig.concurrency` beside `maxConcurrentRuns: 4` on the queued coordinator renders an
    instance that Dagster 1.13 refuses (webserver, daemon and run pods would all fail to start)."""
    from dagster import DagsterInvalidConfigError

    def first_shape(values):
        values.pop("concurrency")
        values["additionalInstanceConfig"] = {"concurrency": {"pools": {"default_limit": 1}}}
        values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurrentRuns"] = 4

    rendered = instance_yaml(merged_values(_edited_values(tmp_path, first_shape)))
    assert rendered["run_coordinator"]["config"]["max_concurrent_runs"] == 4
    with pytest.raises(DagsterInvalidConfigError, match="incompatible with the `concurrency > runs` config"):
        _load_instance_config(tmp_path, rendered)


def test_run_pods_get_runk8sconfigs_resources_and_the_staging_volume():
    """A code location's `resources` win over runK8sConfig key by key in run pods: the deployment sets none, so
    run pods get the 1 CPU / 1 GiB written in runK8sConfig. The staging folder is on a volume in the code server
    and (through the container context) in every run pod; no ignored DAGSTER_PG_* variables."""
    values = merged_values(VALUES)
    deployment = _user_deployment(values)
    run_config = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"]
    assert not deployment.get("resources")
    assert run_config["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    env = {e["name"]: e.get("value") for e in deployment["env"]}
    assert not [name for name in env if name.startswith("DAGSTER_PG_")]
    mounts = {m["mountPath"]: m["name"] for m in deployment["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["volumes"]}
    assert volumes[mounts[env["WANDB_ASSETS_STAGING_DIR"]]] == {"name": "staging", "emptyDir": {}}
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}


def test_every_variable_the_values_set_is_one_the_code_reads():
    """The decisions the values make for this project: an existing PostgreSQL, the K8sRunLauncher and queued
    coordinator, the code location served by module, the lake's conninfo without a password, and no variable
    the code does not read."""
    from wandb_assets.settings import ENV_VARS

    values = merged_values(VALUES)
    assert values["postgresql"]["enabled"] is False and values["global"]["postgresqlSecretName"]
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    deployment = _user_deployment(values)
    assert deployment["codeServerArgs"] == ["-m", "wandb_assets.definitions"]
    env = {item["name"]: item["value"] for item in deployment["env"]}
    assert env["WANDB_ASSETS_DUCKDB"].startswith("ducklake:postgres:") and "password" not in env["WANDB_ASSETS_DUCKDB"]
    assert set(env) - set(ENV_VARS) == set()


@pytest.mark.slow
def test_the_image_runs_with_the_charts_args_alone(tmp_path, dagster_home, monkeypatch):
    """The code server: the Dockerfile's ENTRYPOINT followed by the chart's container args (loopback instead of
    0.0.0.0, a free port), answering the chart's readiness probe. A run pod: the K8sRunLauncher's args
    (`dagster api execute_run <ExecuteRunArgs>`) run the offline job on a real log to SUCCESS."""
    from dagster import DagsterInstance, DagsterRunStatus
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._grpc.types import ExecuteRunArgs

    entrypoint, cmd = image_entrypoint_and_cmd(REPO / "Dockerfile")
    deployment = _user_deployment(merged_values(VALUES))
    port = free_port()
    chart_args = [
        "127.0.0.1" if a == "0.0.0.0" else str(port) if a == str(deployment["port"]) else a
        for a in code_server_args(deployment)
    ]
    command = effective_command(entrypoint, cmd, chart_args)
    assert command == chart_args, f"the image would run {command}"
    assert effective_command(entrypoint, cmd, None)[:3] == ["dagster", "code-server", "start"]  # `docker run IMAGE`
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen(
        [str(bin_dir / command[0]), *command[1:]],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        probe = [str(bin_dir / "dagster"), "api", "grpc-health-check", "-p", str(port)]
        deadline, healthy = time.monotonic() + 120, None
        while time.monotonic() < deadline and server.poll() is None:
            healthy = subprocess.run(probe, capture_output=True, text=True)
            if healthy.returncode == 0:
                break
            time.sleep(1)
        assert server.poll() is None, f"the code server exited with {server.returncode}"
        assert healthy is not None and healthy.returncode == 0, healthy.stdout + healthy.stderr
    finally:
        stop_process_group(server)

    logs = tmp_path / "logs"
    logs.mkdir()
    fixture = REPO / "tests" / "fixtures" / "wandb-0.15.12-offline-run-old01512.wandb.gz"
    with gzip.open(fixture) as packed, open(logs / "run-old01512.wandb", "wb") as log:
        shutil.copyfileobj(packed, log)
    from wandb_assets.definitions import defs

    job = defs.resolve_job_def("offline")
    origin = JobPythonOrigin(
        job_name="offline",
        repository_origin=RepositoryPythonOrigin(
            executable_path=sys.executable,
            code_pointer=ModuleCodePointer("wandb_assets.definitions", "defs", str(REPO)),
            entry_point=["dagster"],  # what a code server reports for its runs
        ),
    )
    with DagsterInstance.get() as instance:
        run = instance.create_run_for_job(
            job,
            run_config={"ops": {"offline_runs": {"config": {"paths": [str(logs)]}}}},
            job_code_origin=origin,
        )
        launcher_args = ExecuteRunArgs(
            job_origin=origin, run_id=run.run_id, instance_ref=instance.get_ref(), set_exit_code_on_failure=True
        ).get_command_args()
        assert launcher_args[:3] == ["dagster", "api", "execute_run"]
        pod = effective_command(entrypoint, cmd, list(launcher_args))
        done = subprocess.run(
            [str(bin_dir / pod[0]), *pod[1:]], cwd=dagster_home, env=os.environ.copy(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        finished = instance.get_run_by_id(run.run_id)
        assert finished.status == DagsterRunStatus.SUCCESS
    import duckdb

    with duckdb.connect(os.environ["WANDB_ASSETS_DUCKDB"], read_only=True) as con:
        assert con.execute("SELECT run_id, source FROM runs").fetchall() == [("old01512", "offline")]
