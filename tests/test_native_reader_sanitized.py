"""The native .wandb reader (wandb_assets/lib/_wandb_log.c) built with AddressSanitizer and UndefinedBehaviorSanitizer
and fed 10,000 damaged logs whose chunk CRCs are valid (so the damage reaches the record parser, not only the
framing): random payload bytes, payloads replaced with random bytes, random chunks of every kind, cuts. Any
out-of-bounds access or undefined behaviour aborts the process. Also: the fold's hash is keyed per process."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.offline_logs import legacy_log_bytes, legacy_records, log_of, write_offline_run

FUZZ = r"""
import random, struct, sys, zlib
sys.path.insert(0, sys.argv[1])
import _wandb_log

SEEDS = {kind: zlib.crc32(bytes([kind])) for kind in (1, 2, 3, 4)}
BLOCK, HEADER = 32768, 7

def chunks(data):
    found, offset = [], HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:
            offset += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        found.append((offset, length, kind))
        offset += HEADER + length
    return found

def reseal(out, offset, length, kind):
    payload = bytes(out[offset + HEADER : offset + HEADER + length])
    struct.pack_into("<I", out, offset, zlib.crc32(payload, SEEDS[kind]) & 0xFFFFFFFF)

rng = random.Random(int(sys.argv[2]))
bases = [open(path, "rb").read() for path in sys.argv[4:]]
table = [chunks(b) for b in bases]
for iteration in range(int(sys.argv[3])):
    which = rng.randrange(len(bases))
    data, found = bases[which], table[which]
    out = bytearray(data)
    mode = iteration % 4
    if mode == 0:  # a few payload bytes set at random, CRC made valid again
        for _ in range(rng.randrange(1, 6)):
            offset, length, kind = found[rng.randrange(len(found))]
            if length:
                out[offset + HEADER + rng.randrange(length)] = rng.randrange(256)
                reseal(out, offset, length, kind)
    elif mode == 1:  # a payload replaced with random bytes of its length
        offset, length, kind = found[rng.randrange(len(found))]
        out[offset + HEADER : offset + HEADER + length] = rng.randbytes(length)
        reseal(out, offset, length, kind)
    elif mode == 2:  # random chunks of random kinds appended, each with a valid CRC
        for _ in range(rng.randrange(1, 8)):
            room = BLOCK - len(out) % BLOCK
            if room < HEADER:
                out += bytes(room)
                continue
            payload = rng.randbytes(rng.randrange(0, min(room - HEADER, 600) + 1))
            kind = rng.randrange(1, 5)
            out += struct.pack("<IHB", zlib.crc32(payload, SEEDS[kind]) & 0xFFFFFFFF, len(payload), kind) + payload
    else:  # a valid prefix, cut anywhere, with a resealed mutation before the cut
        offset, length, kind = found[rng.randrange(len(found))]
        if length:
            out[offset + HEADER + rng.randrange(length)] ^= 1 << rng.randrange(8)
            reseal(out, offset, length, kind)
        out = out[: rng.randrange(1, len(out) + 1)]
    _wandb_log.scan(bytes(out), 7)
    _wandb_log.scan(bytes(out), 0)
print("fuzzed", int(sys.argv[3]))
"""


def _sanitized_build(folder: Path, name: str = "_wandb_log") -> Path:
    """A native module (``wandb_assets/lib/<name>.c``) compiled with -fsanitize=address,undefined (UB aborts)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = folder / f"{name}{suffix}"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-g", "-std=c99", "-fno-omit-frame-pointer"]
        + ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        + [f"-I{sysconfig.get_paths()['include']}", str(REPO / "wandb_assets" / "lib" / f"{name}.c")]
        + ["-o", str(target)],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def _libasan() -> str:
    found = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(found):
        pytest.fail("gcc has no libasan.so here (Debian's gcc-12 ships it with libasan8)")
    return found


def test_the_native_reader_survives_10000_damaged_logs_under_asan_and_ubsan(tmp_path):
    import gzip

    write_offline_run(tmp_path / "written", "failed", 5)  # a log written by the installed wandb (0.31)
    bases = [log_of(tmp_path / "written", "fail0001"), tmp_path / "legacy.wandb"]
    bases[1].write_bytes(legacy_log_bytes(legacy_records(40, 1_700_000_000)))
    for fixture in sorted((REPO / "tests" / "fixtures").glob("*.wandb.gz")):  # real 0.10.33 and 0.15.12 logs
        bases.append(tmp_path / fixture.name.removesuffix(".gz"))
        bases[-1].write_bytes(gzip.decompress(fixture.read_bytes()))
    build = tmp_path / "build"
    build.mkdir()
    _sanitized_build(build)
    _run_fuzz(FUZZ, build, "20261124", "10000", *map(str, bases))


def _run_fuzz(code: str, build: Path, seed: str, times: str, *args: str, **env: str) -> None:
    """``code`` run with the sanitized modules in ``build`` (``times`` inputs): it must end cleanly, with no report."""
    env = {
        **os.environ,
        "LD_PRELOAD": _libasan(),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",  # CPython itself keeps memory until exit
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", code, str(build), seed, times, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == f"fuzzed {times}"
    assert "runtime error" not in done.stderr and "AddressSanitizer" not in done.stderr


CURVES_FUZZ = r"""
import json, random, sys
sys.path.insert(0, sys.argv[1])
import _curves_scan

rng = random.Random(int(sys.argv[2]))
keys = ["_timestamp", "system.gpu.0.gpu", "system.gpu.7.memory", "system.gpu.4095.powerWatts", "system.gpu.01.gpu",
        "system.gpu.12.temp", "system.gpu.", "system.gpu.1.", "system.gpu.12345.gpu", "system.cpu", ""]
numbers = ["0", "-0", "1.5", "-2.5e-3", "1e400", "123456789012345678", "1234567890123456789", "0.1", "9" * 80,
           "1" + "0" * 30 + ".5", "1e-99999999", "5e-324"]
alphabet = '{}[]":,.-+eE0123456789 \t\n\\ux\x1e\x00'
runs = 0
for iteration in range(int(sys.argv[3])):
    events = []
    for _ in range(rng.randrange(0, 12)):
        pairs = [(rng.choice(keys), rng.choice(numbers)) for _ in range(rng.randrange(0, 10))]
        text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"
        mode = rng.randrange(4)
        if mode == 1 and text:  # a character changed
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(alphabet) + text[at + 1:]
        elif mode == 2:  # cut anywhere
            text = text[: rng.randrange(len(text) + 1)]
        elif mode == 3:  # random text of the characters JSON is made of
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        events.append(text if rng.random() < 0.95 else rng.choice([None, 5, {"a": 1}, "\ud800"]))
    values = [None, True, 1, -(2**70), 2**2000, 1.5, float("nan"), float("inf"), "x", [1], {"_step": 1}]
    def point():
        names = ["_step", "_timestamp", "m", "n", "\ud800"]
        return {rng.choice(names): rng.choice(values) for _ in range(rng.randrange(5))}
    series = [[point() if rng.random() < 0.9 else rng.choice(values) for _ in range(rng.randrange(6))]
              for _ in range(rng.randrange(4))]
    sampled = rng.choice([series, series, None, 5, "x", {"a": 1}, [series, 1]])
    runs += 1
    _curves_scan.gpu_samples([events, None, events[:1]])
    _curves_scan.history_points([["m", "n"], [], ["\ud800", 7, "m"]], [sampled, sampled, sampled])
print("fuzzed", runs)
"""


def test_the_native_curves_scan_survives_random_event_texts_under_asan_and_ubsan(tmp_path):
    """The native scan of the curves (``_curves_scan.c``) on 20,000 requests of damaged, cut and random event texts
    and of histories of any JSON values: any out-of-bounds access or undefined behaviour aborts the process."""
    _sanitized_build(tmp_path, "_curves_scan")
    # each text its own allocation (no pymalloc arena around it): a read past one is seen
    _run_fuzz(CURVES_FUZZ, tmp_path, "20261129", "20000", PYTHONMALLOC="malloc")


def test_the_sanitizers_would_report_an_out_of_bounds_read(tmp_path):
    """The harness can fail: a reader that reads one byte past its buffer aborts under it."""
    broken = tmp_path / "_wandb_log.c"
    source = (REPO / "wandb_assets" / "lib" / "_wandb_log.c").read_text()
    marker = "static PyObject *hash_for_tests(PyObject *self, PyObject *args) {"
    assert marker in source
    broken.write_text(
        source.replace(
            "    uint64_t h = hash_bytes(view.buf, (size_t)view.len);",
            "    uint8_t *copy = malloc((size_t)view.len);\n"
            "    memcpy(copy, view.buf, (size_t)view.len);\n"
            "    volatile uint8_t past = copy[view.len];  /* one byte past the end */\n"
            "    free(copy);\n"
            "    uint64_t h = hash_bytes(view.buf, (size_t)view.len) + past;",
        )
    )
    target = tmp_path / f"_wandb_log{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-g", "-std=c99", "-fsanitize=address,undefined"]
        + [f"-I{sysconfig.get_paths()['include']}", str(broken), "-o", str(target)],
        check=True,
        capture_output=True,
    )
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import _wandb_log; _wandb_log._hash(bytes(bytearray(24)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_PRELOAD": _libasan(), "ASAN_OPTIONS": "detect_leaks=0"},
        timeout=120,
    )
    assert done.returncode != 0 and "AddressSanitizer" in done.stderr


def test_the_folds_hash_is_keyed_per_process():
    """Crafted keys cannot collide on purpose: the same key hashes differently under two hash keys."""
    code = "from wandb_assets.lib import _wandb_log; print(_wandb_log._hash(b'loss'), _wandb_log._hash(b'acc'))"
    seen = {
        seed: subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert seen["1"] != seen["2"]
