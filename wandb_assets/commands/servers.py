"""Commands that serve on loopback until interrupted: ``ui`` (``dagster dev``) and ``docs`` (the dbt docs)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

#: Starts of warning messages `wandb-assets ui` hides (PYTHONWARNINGS matches a message's beginning).
QUIET_WARNINGS = ("Function `dev_command` is superseded",)


def dagster_dev(port: int = 3000, verbose: bool = False, in_home: bool = False) -> int:
    """``dagster dev`` on this repository's workspace, until it exits (``start_dagster_dev`` then ``serve``)."""
    return serve(start_dagster_dev(port, verbose, in_home))


def start_dagster_dev(port: int = 3000, verbose: bool = False, in_home: bool = False) -> subprocess.Popen:
    """Start ``dagster dev`` on this repository's workspace and return at once (the demo builds its warehouse while
    the UI comes up). Quiet by default: the daemon's and webserver's INFO lines (a "sensor skipped" line every 30 s)
    are hidden; runs print their own INFO lines and warnings (the instance's ``python_logs.python_log_level``)."""
    os.environ.setdefault("DAGSTER_HOME", str(Path.cwd()))
    from wandb_assets.commands.common import claim_instance, dagster_instance

    claim_instance(Path(os.environ["DAGSTER_HOME"]))  # the UI's daemon writes this warehouse: the instance's own
    # The instance's storage made here, once, before the UI's processes and this command's runs open it: a fresh
    # SQLite storage made by two processes at once has its schema stamped twice ("more than one head"), and every
    # later opening of it fails (seen when a command loading no dbt raced `dagster dev`'s code server to it).
    dagster_instance().dispose()
    workspace = Path(__file__).resolve().parents[2] / "workspace.yaml"
    # Inherited by the daemon, the code server and every run worker: two notices nobody can act on (dagster-aws
    # is pinned with dagster; `dg dev` would only wrap this same command in `uv run`).
    os.environ["PYTHONWARNINGS"] = ",".join(
        filter(None, [os.environ.get("PYTHONWARNINGS"), *(f"ignore:{text}" for text in QUIET_WARNINGS)])
    )
    command = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-w",
        str(workspace),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "--log-level",
        "info" if verbose else "warning",
    ]
    print(f"Dagster UI: http://127.0.0.1:{port} (Ctrl-C to stop)", flush=True)
    # in_home (the demo, whose instance is its own): run from DAGSTER_HOME, else `dagster dev` warns that the
    # repository's dagster.yaml "will not be used", which reads as "your configuration is ignored"
    cwd = os.environ["DAGSTER_HOME"] if in_home else None
    # stderr through a filter that drops grpc's spurious poller traceback (lib/terminal.py), on a thread of its own
    # from the start (a pipe nobody reads would stall it); stdout is untouched. Its own process group: Ctrl-C and a
    # service manager's SIGTERM reach `dagster dev`, its webserver, daemon and code servers through us (``serve``).
    dev = subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE, start_new_session=True)
    dev.stderr_thread = threading.Thread(target=_pass_through, args=(dev.stderr,), daemon=True)
    dev.stderr_thread.start()
    return dev


def serve(dev: subprocess.Popen) -> int:
    """Wait for a started ``dagster dev``; Ctrl-C and SIGTERM stop its whole process group, and whatever of it is left
    ``STOP_WITHIN_S`` later is killed (nothing outlives `ui`)."""
    stopping: list[int] = []
    deadline = threading.Timer(STOP_WITHIN_S, _signal_group, (dev.pid, signal.SIGKILL))
    deadline.daemon = True

    def stop(signum, _frame) -> None:
        stopping.append(signum)
        _signal_group(dev.pid, signum)
        if len(stopping) == 1:
            deadline.start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # until `dagster dev` exits (reaped at once: a grandchild still holding its stderr must not leave it a zombie)
        while dev.poll() is None:
            dev.stderr_thread.join(0.2)
        code = dev.wait()
    finally:
        deadline.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _signal_group(dev.pid, signal.SIGKILL)  # what of the group is left (a code server mid-start)
    if not stopping:
        return code
    return 0 if stopping[0] == signal.SIGINT else 128 + stopping[0]  # Ctrl-C: stopped as asked


def stop_dagster_dev(dev: subprocess.Popen) -> None:
    """Stop a started ``dagster dev`` and its whole process group now (the demo failed while building)."""
    _signal_group(dev.pid, signal.SIGTERM)
    try:
        dev.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(dev.pid, signal.SIGKILL)


#: How long `ui` gives `dagster dev` and its servers to stop after Ctrl-C or SIGTERM before killing what is left.
STOP_WITHIN_S = 8.0


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def _pass_through(stream) -> None:
    from wandb_assets.lib.terminal import drop_known_noise

    for line in drop_known_noise(iter(stream.readline, b"")):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()


def cmd_ui(args: argparse.Namespace) -> int:
    return dagster_dev(args.port, args.verbose)


def cmd_docs(args: argparse.Namespace) -> int:
    """Serve the analysts' dbt docs (one static page) on loopback until interrupted."""
    import functools
    import http.server

    from wandb_assets.defs.analytics.project import DOCS_SITE
    from wandb_assets.settings import ConfigError

    if not DOCS_SITE.exists():
        raise ConfigError(
            f"No dbt docs at {DOCS_SITE} yet: each analytics run writes them (`uv run wandb-assets analytics`)."
        )
    if args.write:
        target = Path(args.write) / "index.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(DOCS_SITE.read_bytes())
        print(f"Wrote the dbt docs site to {target}")
        return 0
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(DOCS_SITE.parent))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    with http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler) as server:
        print(
            f"The analysts' dbt docs (tables, models, columns, lineage): http://127.0.0.1:{server.server_port}/",
            flush=True,
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0
