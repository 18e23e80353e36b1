"""Builds the native ``.wandb`` reader (``wandb_assets/lib/_wandb_log.c``) and the native scan of the curves' system
stream (``wandb_assets/lib/_curves_scan.c``). Both are optional: where no C compiler is, the install still succeeds,
``wandb_assets.lib.offline_runs`` reads logs in Python (same results, ~9x slower: 189 vs 19 ms a log in
benchmarks/bench_offline.py; ``offline_runs.reader()`` says which is in use) and ``wandb_assets.lib.curves`` parses
every event in DuckDB (same rows; ``curves.scanner()`` says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "wandb_assets.lib._wandb_log",
            ["wandb_assets/lib/_wandb_log.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        ),
        Extension(
            "wandb_assets.lib._curves_scan",
            ["wandb_assets/lib/_curves_scan.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        ),
    ]
)
