"""The reconciliation soak (issue 42): the suite's organisation state machine (``tests/test_reconcile_model.py``) with
random histories, example after example, for ``--minutes``: every gpu_usage row, the GPU gauges of each tick (stored
and as the loopback Datadog received them) and each build of the marts and the chargeback must equal the reference
model, and ``check`` must hold after every step. Run it before each release:

    uv run python benchmarks/soak_reconcile.py --minutes 30

It prints the examples and steps run, the comparisons made and the copies compared by state; the first history that
breaks a rule stops it with Hypothesis's shrunk reproduction (exit 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: One pytest process per batch: the machine's examples, random (RECONCILE_RANDOM), shrunk on failure.
BATCH = """
import os, sys
sys.path.insert(0, {root!r})
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-n", "0", "-s",
                      "tests/test_reconcile_model.py::test_every_number_reconciles_with_the_reference_model",
                      "-o", "addopts="]))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--examples", type=int, default=10, help="histories per batch (default 10)")
    parser.add_argument("--steps", type=int, default=25, help="steps per history (default 25)")
    args = parser.parse_args()
    deadline = time.monotonic() + 60 * args.minutes
    batches = 0
    while time.monotonic() < deadline:
        env = {
            **os.environ,
            "RECONCILE_RANDOM": "1",
            "RECONCILE_DBT": "1",  # the analysts' marts and chargeback compared too
            "RECONCILE_SHRINK": "1",
            "RECONCILE_EXAMPLES": str(args.examples),
            "RECONCILE_STEPS": str(args.steps),
        }
        done = subprocess.run(
            [sys.executable, "-c", BATCH.format(root=str(ROOT))], cwd=ROOT, env=env, capture_output=True, text=True
        )
        batches += 1
        stats = [line for line in done.stdout.splitlines() if line.startswith("{'comparisons'")]
        print(f"batch {batches}: {'passed' if done.returncode == 0 else 'FAILED'} {stats[-1] if stats else ''}")
        if done.returncode != 0:  # the whole output kept: the assertion and the steps come before dbt's log lines
            kept = Path(tempfile.gettempdir()) / f"soak-reconcile-failure-{os.getpid()}.log"
            kept.write_text(done.stdout + done.stderr)
            failure = [line for line in done.stdout.splitlines() if line.startswith(("E ", "state.", "Falsifying"))]
            print("\n".join(failure[-200:]))
            print(f"The whole output: {kept}")
            return 1
    print(f"{batches} batches of {args.examples} histories x {args.steps} steps: every number reconciled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
