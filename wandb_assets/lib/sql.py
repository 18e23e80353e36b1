"""Small SQL helpers shared by the warehouse modules. No Dagster here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from wandb_assets.lib.normalize import ENDED_STATES

#: ``'finished', 'failed', ...``: the ended states, ready for ``state IN (...)``.
ENDED_SQL = ", ".join(f"'{state}'" for state in ENDED_STATES)


@contextmanager
def transaction(con) -> Iterator[None]:
    """``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` when the body raises (so a failed write changes nothing)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
