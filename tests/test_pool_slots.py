"""A run killed inside a warehouse step gives its pool slot back once it has ended, so the next run's step gets it.

Real parts: the repository's dagster.yaml (SQLite instance, one-slot pools, run monitoring), a child process
holding the slot, SIGKILL, and Dagster's own slot-freeing iteration of the monitoring daemon.
"""

import os
import subprocess
import sys
from pathlib import Path

import yaml

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


SCENARIO = """
import logging, os, signal, subprocess, sys, time
from types import SimpleNamespace
from dagster import DagsterInstance, DagsterRunStatus
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration

child_code, marker = sys.argv[1], sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", child_code, marker])
try:
    deadline = time.monotonic() + 60
    while not os.path.exists(marker):
        assert child.poll() is None and time.monotonic() < deadline, "the child never reached its step"
        time.sleep(0.1)
finally:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

with DagsterInstance.get() as instance:
    storage = instance.event_log_storage
    (killed,) = instance.get_runs()
    assert killed.status == DagsterRunStatus.STARTED, killed.status  # nothing noticed the kill
    info = storage.get_concurrency_info("warehouse")
    assert [slot.run_id for slot in info.claimed_slots] == [killed.run_id], info
    # the next tick's step asks for the slot: it waits (the killed run holds it) ...
    assert not storage.claim_concurrency_slot("warehouse", "next-tick", "write_after").is_claimed
    # ... until run monitoring fails the run (its max_runtime passes, or its worker is found dead) and the
    # daemon's slot iteration gives the slot back free_slots_after_run_end_seconds later
    instance.report_run_failed(killed)
    time.sleep(1.2)
    list(execute_concurrency_slots_iteration(SimpleNamespace(instance=instance), logging.getLogger("test")))
    assert storage.claim_concurrency_slot("warehouse", "next-tick", "write_after").is_claimed
    info = storage.get_concurrency_info("warehouse")
    assert [(slot.run_id, slot.step_key) for slot in info.claimed_slots] == [("next-tick", "write_after")], info
    print("the next run got the slot")
"""


def test_a_run_killed_mid_step_frees_the_only_warehouse_slot(tmp_path):
    """In its own interpreter (as the CLI and the daemon run), with this repository's dagster.yaml. Output goes
    to files: a SIGKILLed Dagster process can leave its compute-log ``tail`` behind, holding any pipe open."""
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    if "free_slots_after_run_end_seconds" in config["run_monitoring"]:
        config["run_monitoring"]["free_slots_after_run_end_seconds"] = 1  # the repository says 60; wait 1 s here
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    out, err = tmp_path / "scenario.out", tmp_path / "scenario.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run(
            [sys.executable, "-c", SCENARIO, CHILD, str(tmp_path / "in-step")],
            cwd=tmp_path,
            env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            timeout=240,
        ).returncode
    assert code == 0, err.read_text()[-3000:]
    assert out.read_text().strip().splitlines()[-1] == "the next run got the slot"
