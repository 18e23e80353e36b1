"""Progress of a multi-day fetch, as people expect to read it: runs fetched, days done of total, runs/s, ETA.

The fetch updates one ``FetchProgress`` from its workers; whoever runs it renders ``line()`` (log lines,
Dagster metadata) or ``bar()`` (a terminal). ``listening`` lets a process that runs the pipeline in
process (the CLI) watch a fetch it did not start itself, e.g. to draw a progress bar.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class FetchProgress:
    """Counters of one fetch; thread-safe. ``days`` maps a day label to how many slices it was split into."""

    def __init__(self, days: dict[str, int], other_slices: int = 0, clock=time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.days_total = len(days)
        self.slices_total = sum(days.values()) + other_slices
        self._slices_left = dict(days)
        self.runs_by_day: Counter[str] = Counter()
        self.runs = 0
        self.slices_done = 0
        self._expected: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def days_done(self) -> int:
        return sum(1 for left in self._slices_left.values() if left == 0)

    def expect(self, slice_index: int, total: int) -> None:
        """A slice's first page said how many runs it holds."""
        with self._lock:
            self._expected.setdefault(slice_index, total)

    def add(self, day: str | None, runs: int) -> None:
        with self._lock:
            self.runs += runs
            if day is not None:
                self.runs_by_day[day] += runs

    def slice_done(self, day: str | None, *more_days: str) -> None:
        """One slice finished: of ``day`` (None: of no day), and of ``more_days`` for a slice of several days."""
        with self._lock:
            self.slices_done += 1
            for label in (day, *more_days):
                if label is not None:
                    self._slices_left[label] -= 1

    def elapsed(self) -> float:
        return self._clock() - self.started

    def rate(self) -> float:
        elapsed = self.elapsed()
        return self.runs / elapsed if elapsed > 0 else 0.0

    def estimated_total(self) -> int | None:
        """Runs the whole fetch will return: the counts the server reported, extrapolated to unstarted slices."""
        with self._lock:
            if not self._expected:
                return None
            known = sum(self._expected.values())
            unknown = self.slices_total - len(self._expected)
            return max(self.runs, round(known + unknown * known / len(self._expected)))

    def eta_seconds(self) -> float | None:
        total, rate = self.estimated_total(), self.rate()
        if total is None or rate <= 0:
            return None
        return max(0.0, (total - self.runs) / rate)

    def line(self) -> str:
        """``fetched 12,345 runs; 23/60 days done; 4,100 runs/s; ETA 3 s``; once every day is done, how long it took
        (``... 60/60 days done; 4,100 runs/s; in 41 s``: an ETA beside "all done" read as a contradiction)."""
        eta = self.eta_seconds()
        if self.days_total and self.days_done >= self.days_total:
            when = f"in {format_seconds(self.elapsed())}"
        else:
            when = "ETA unknown" if eta is None else f"ETA {format_seconds(eta)}"
        days = f"{self.days_done}/{self.days_total} days done"
        return f"fetched {self.runs:,} runs; {days}; {self.rate():,.0f} runs/s; {when}"

    def bar(self, width: int = 30) -> str:
        """A one-line bar over days done (for a terminal, drawn with a carriage return)."""
        share = self.days_done / self.days_total if self.days_total else 1.0
        filled = round(width * share)
        return f"[{'#' * filled}{'.' * (width - filled)}] {self.line()}"


def format_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


_LISTENERS: list[Callable[[FetchProgress, bool], None]] = []


@contextmanager
def listening(listener: Callable[[FetchProgress, bool], None]) -> Iterator[None]:
    """Call ``listener(progress, finished)`` for every progress update of fetches in this process."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def publish(progress: FetchProgress, finished: bool) -> None:
    for listener in list(_LISTENERS):
        listener(progress, finished)
