"""Offline run logs written by the installed wandb client (``WANDB_MODE=offline``), one process per run, and a
writer of the older Python client's format. The expected values in the tests are the numbers written here."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

SCENARIO = r"""
import math, os, signal, sys, time
import wandb

scenario, rows = sys.argv[1], int(sys.argv[2])
common = dict(project="offline-proj", entity="offline-team", mode="offline")
if scenario == "ci":
    run = wandb.init(
        id="ci0001", name="github.sky.main.abc1234.ppo_atari.20261120T101010", tags=["ci", "main"], group="g1",
        job_type="bench",
        config={"lr": 0.001, "compute": {"gpu_count": 8, "gpu_type": "H100"}, "nested": {"a": {"b": [1, 2]}},
                "unicode": "h\u00e9llo \u2713", "inf": math.inf},
        **common,
    )
    run.log({"first_only": 1})  # a key logged once, at the start: its value must survive the whole log
    for i in range(rows):
        run.log({"overview/steps_per_second": 1000 + i, "overview/epoch_steps_per_second": 2000 + i,
                 "overview/sps": 3000 + i, "timing_cumulative/sps": 4000 + i, "timing_per_epoch/sps": 5000 + i,
                 "loss": 1.0 / (i + 1), "eval": {"acc": i / 100}})
    run.summary["best"] = 42.5
    run.summary["nan"] = math.nan
    run.summary["neg_inf"] = -math.inf
    run.summary["emoji"] = "\u2713 \u00fcn\u00ef"
    run.summary["loss"] = 0.0  # a summary write wins over the history's last value
    run.finish(exit_code=0)
elif scenario == "failed":
    run = wandb.init(id="fail0001", name="train-failed", config={"lr": 0.1, "clip": math.nan}, **common)
    for i in range(rows):
        run.log({"loss": float(i), "grad_norm": math.nan})  # diverged: NaN on every row, so in the summary
    run.summary.update({"final_loss": math.nan})  # the client itself writes an explicit NaN as null
    run.finish(exit_code=1)
elif scenario == "sweep":
    os.environ["WANDB_SWEEP_ID"] = "sw123abc"
    os.environ["WANDB_RUN_ID"] = "sweep0001"
    run = wandb.init(id="sweep0001", name="sweep-run-1", config={"x": 1}, **common)
    for i in range(rows):
        run.log({"loss": float(i)})
    run.finish()
elif scenario == "early":
    run = wandb.init(id="early0001", name="train-early", **common)
    run.log({"train": {"loss": 5.0}})  # once, first; its nested key's last part is the later key "loss"
    for i in range(rows):
        run.log({"loss": 1.0 / (i + 1)})
    run.finish()
elif scenario == "killed":
    run = wandb.init(id="kill0001", name="train-killed", config={"lr": 0.5}, **common)
    for i in range(rows):
        run.log({"loss": float(i)})
    # killed once wandb-core has written the config and some history, as a long job's would be (a state, not a
    # time: under a busy machine a second was not always enough)
    from pathlib import Path
    from wandb_assets.lib.offline_runs import read_offline_run
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        logs = list(Path(os.environ["WANDB_DIR"]).rglob("run-kill0001.wandb"))
        seen = read_offline_run(logs[0]) if logs else None
        if seen is not None and seen.config.get("lr") == 0.5 and "loss" in seen.summary:
            break
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def write_offline_run(wandb_dir: Path, scenario: str, rows: int) -> None:
    """One offline run written by the installed wandb in its own process (``killed``: SIGKILLed mid-run)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_DIR=str(wandb_dir), WANDB_MODE="offline", WANDB_SILENT="true")
    writer = subprocess.Popen(
        [sys.executable, "-c", SCENARIO, scenario, str(rows)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    _, err = writer.communicate(timeout=180)
    if scenario != "killed":
        assert writer.returncode == 0, err[-2000:]
    wait_for_group_to_end(writer.pid)


def wait_for_group_to_end(group: int, timeout_s: float = 120.0) -> None:
    """Until every process of the session ``group`` started (the writer's wandb-core too, which outlives a killed
    writer for a moment) has exited: its log is then complete. A zombie counts as ended (a container's PID 1 may
    never reap an orphan); past the timeout the rest are killed."""
    import time

    import psutil

    def running() -> list[psutil.Process]:
        alive = []
        for process in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return alive

    deadline = time.monotonic() + timeout_s
    while (alive := running()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in alive:
        process.kill()


def log_of(wandb_dir: Path, run_id: str) -> Path:
    (path,) = Path(wandb_dir).rglob(f"run-{run_id}.wandb")
    return path


# -- the older Python client's format ------------------------------------------------------------------------
# wandb 0.10-0.16 wrote the log from Python (wandb/sdk/internal/datastore.py): the same 7-byte file header,
# 32 KiB blocks, chunk CRC-32 seeded with the type byte, zero padding of a block's last < 7 bytes. Its records
# used `key` (no `nested_key`), history records had no `step`, the summary was written whole when the run
# finished, and the run record carried the config. This writer makes such a log from the installed protobuf
# classes, setting only the fields those clients set.

BLOCK, HEADER_LEN = 32768, 7


def full_chunks(data: bytes) -> list[tuple[int, int]]:
    """(offset, payload length) of every FULL chunk of an undamaged log, in order."""
    chunks, offset = [], HEADER_LEN
    while offset + HEADER_LEN <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER_LEN:
            offset += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        if kind == 1:
            chunks.append((offset, length))
        offset += HEADER_LEN + length
    return chunks


def with_payload_byte(data: bytes, chunk: tuple[int, int], index: int, value: int) -> bytes:
    """``data`` with byte ``index`` of a FULL chunk's payload set to ``value`` and the chunk's CRC made valid
    again: damage the framing cannot see, only the record's parse."""
    offset, length = chunk
    out = bytearray(data)
    out[offset + HEADER_LEN + index] = value
    payload = bytes(out[offset + HEADER_LEN : offset + HEADER_LEN + length])
    struct.pack_into("<I", out, offset, zlib.crc32(payload, zlib.crc32(b"\x01")) & 0xFFFFFFFF)
    return bytes(out)


def legacy_log_bytes(records: list, header: bool = True) -> bytes:
    """The bytes of a log holding ``records`` (``Record`` messages), framed as the Python client framed them."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0) if header else b"")
    seeds = {kind: zlib.crc32(bytes([kind])) & 0xFFFFFFFF for kind in (1, 2, 3, 4)}

    def chunk(data: bytes, kind: int) -> None:
        out.extend(struct.pack("<IHB", zlib.crc32(data, seeds[kind]) & 0xFFFFFFFF, len(data), kind) + data)

    for record in records:
        data = record.SerializeToString()
        space = BLOCK - len(out) % BLOCK
        if space < HEADER_LEN:
            out.extend(b"\x00" * space)
            space = BLOCK
        if len(data) + HEADER_LEN <= space:
            chunk(data, 1)
            continue
        room = space - HEADER_LEN
        chunk(data[:room], 2)
        rest = data[room:]
        while len(rest) > BLOCK - HEADER_LEN:
            chunk(rest[: BLOCK - HEADER_LEN], 3)
            rest = rest[BLOCK - HEADER_LEN :]
        chunk(rest, 4)
    return bytes(out)


def legacy_records(history_rows: int, start_seconds: int):
    """A finished run as wandb 0.10-0.16 logged it: run (with config), history rows, the summary at the end,
    exit. ``loss`` = 1/(step+1), ``big`` a 40 KB string in the last row (a record split over blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    run = pb.Record()
    run.run.run_id, run.run.entity, run.run.project = "legacy01", "old-team", "old-proj"
    run.run.display_name, run.run.run_group, run.run.job_type = "legacy-run", "grp", "train"
    run.run.tags.extend(["old"])
    run.run.start_time.seconds = start_seconds
    for key, value_json in (("lr", "0.01"), ("compute", '{"gpu_count": 2}'), ("wandb_version", '"0.10.33"')):
        item = run.run.config.update.add()
        item.key, item.value_json = key, value_json
    records.append(run)
    for step in range(history_rows):
        record = pb.Record()
        for key, value_json in (
            ("_step", str(step)),
            ("loss", repr(1.0 / (step + 1))),
            ("_timestamp", str(start_seconds + step)),
            ("_runtime", str(step)),
        ):
            item = record.history.item.add()
            item.key, item.value_json = key, value_json
        if step == history_rows - 1:
            item = record.history.item.add()
            item.key, item.value_json = "big", '"' + "x" * 40000 + '"'
        records.append(record)
    summary = pb.Record()
    for key, value_json in (("loss", "0.5"), ("accuracy", "0.9"), ("_step", str(history_rows - 1))):
        item = summary.summary.update.add()
        item.key, item.value_json = key, value_json
    records.append(summary)
    exit_record = pb.Record()
    exit_record.exit.exit_code = 0
    exit_record.exit.runtime = history_rows + 5
    records.append(exit_record)
    return records
