"""A run killed inside a warehouse step gives its pool slot back once it has ended, so the next run gets it.

Real parts: the repository's dagster.yaml (SQLite instance, one-slot pools, run monitoring), a child process
holding the slot, SIGKILL, and Dagster's own slot-freeing iteration of the monitoring daemon.
"""

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import yaml
from dagster import DagsterInstance, DagsterRunStatus, job, op
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import sys, time
from dagster import DagsterInstance, job, op

@op(pool="warehouse")
def hold_the_writer():
    open(sys.argv[1], "w").write("in the step")
    time.sleep(120)

@job
def killed_mid_step():
    hold_the_writer()

killed_mid_step.execute_in_process(instance=DagsterInstance.get())
"""


@op(pool="warehouse")
def write_after():
    return "wrote"


@job
def next_tick():
    write_after()


def test_a_run_killed_mid_step_frees_the_only_warehouse_slot(tmp_path, monkeypatch):
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if "free_slots_after_run_end_seconds" in config["run_monitoring"]:
        config["run_monitoring"]["free_slots_after_run_end_seconds"] = 1  # the repository says 60; wait 1 s here
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    marker = tmp_path / "in-step"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], cwd=tmp_path, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never reached its step"
            time.sleep(0.1)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    with DagsterInstance.get() as instance:
        (killed,) = instance.get_runs()
        assert killed.status == DagsterRunStatus.STARTED  # nothing noticed the kill
        assert instance.event_log_storage.get_concurrency_info("warehouse").claimed_slots[0].run_id == killed.run_id
        # What run monitoring does to such a run (its max_runtime passes, or its worker is found dead):
        instance.report_run_failed(killed)
        time.sleep(1.2)
        list(execute_concurrency_slots_iteration(SimpleNamespace(instance=instance), logging.getLogger("test")))
        assert instance.event_log_storage.get_concurrency_info("warehouse").claimed_slots == []

        outcome = {}
        runner = threading.Thread(target=lambda: outcome.update(result=next_tick.execute_in_process(instance=instance)))
        runner.start()
        runner.join(timeout=60)
        assert not runner.is_alive(), "the next run is still waiting for the warehouse slot"
        assert outcome["result"].success
