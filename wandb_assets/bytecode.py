"""The environment's bytecode, compiled once. Where ``PYTHONDONTWRITEBYTECODE`` is set (as on our machines) Python
never caches bytecode, so every process (each command, Dagster's servers and run workers, each test worker) would
compile dagster & co. from source on import: 3.9 s instead of 1.8 s to load the definitions. uv's
``compile-bytecode`` setting did it at install, but also re-checked all 26,000 files on every ``uv run`` (2-4 s a
command, "Bytecode compiled 26022 files" each time). So the first command of an environment compiles it once and
leaves a mark beside it; every later one only looks for the mark. ``uv sync --compile-bytecode`` (CI, the image)
does the same at install.
"""

from __future__ import annotations

import compileall
import os
import sys
import sysconfig
from pathlib import Path

#: The mark a compiled environment carries (in its prefix: a new venv starts without it).
MARK = Path(sys.prefix) / ".wandb-assets-bytecode"


def ensure_compiled(say=None) -> bool:
    """Compile the environment's site-packages once (quietly, on every core), unless marked done or Python writes
    bytecode itself; ``say(sentence)`` is told before the minute it takes. True when it compiled now. A read-only
    environment (an image) is left as it is."""
    if MARK.exists() or not sys.dont_write_bytecode or sys.prefix == sys.base_prefix:
        return False
    site = Path(sysconfig.get_paths()["purelib"])
    try:
        MARK.touch()  # writable? (and a second process starting meanwhile does not compile it again)
    except OSError:
        return False
    if say is not None:
        say("Compiling this environment's Python bytecode once (about a minute; later commands start faster) ...")
    compileall.compile_dir(str(site), quiet=2, workers=os.cpu_count() or 1)
    return True
