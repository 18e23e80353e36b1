"""Run-wide politeness for concurrent W&B requests: how many may be in flight, and how big a page may be.

Both are shared by every worker of one fetch, so what one request learns (a 429, a page too big to serve)
applies to the whole run at once. Plain threading; no Dagster, no environment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Throttle:
    """AIMD limit on requests in flight.

    Starts at ``max_limit``. A throttled request (HTTP 429) halves the limit (at most once per pause, so a
    burst of 429s from requests sent together counts as one signal) and stops every worker from starting a
    request for ``wait_s`` (what the server asked for); each success adds ``1 / limit``, so the limit grows
    back by about one per round of requests once the server stops complaining.
    """

    def __init__(self, max_limit: int, clock=time.monotonic) -> None:
        if max_limit < 1:
            raise ValueError("max_limit must be at least 1")
        self.max_limit = max_limit
        self.limit = float(max_limit)
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        self.throttled_responses = 0
        self.decreases = 0
        self.lowest_limit = max_limit
        self._paused_until = 0.0
        self._clock = clock
        self._cond = threading.Condition()

    def allowed(self) -> int:
        """Requests that may be in flight right now."""
        return max(1, int(self.limit))

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one request slot: waits while the limit is reached or the run is paused."""
        with self._cond:
            while True:
                pause = self._paused_until - self._clock()
                if pause <= 0 and self.in_flight < self.allowed():
                    break
                self._cond.wait(timeout=pause if pause > 0 else None)
            self.in_flight += 1
            self.requests += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def succeeded(self) -> None:
        """Additive increase."""
        with self._cond:
            self.limit = min(float(self.max_limit), self.limit + 1.0 / self.limit)
            self._cond.notify_all()

    def throttled(self, wait_s: float) -> None:
        """Multiplicative decrease, and a pause of ``wait_s`` seconds for every worker."""
        with self._cond:
            self.throttled_responses += 1
            now = self._clock()
            if now >= self._paused_until:  # the first 429 of a burst; later ones were sent before the pause
                self.limit = max(1.0, self.limit / 2)
                self.decreases += 1
                self.lowest_limit = min(self.lowest_limit, self.allowed())
            self._paused_until = max(self._paused_until, now + wait_s)
            self._cond.notify_all()


class PageSize:
    """The page size in use for a whole fetch: halved when a page could not be served, never grown back."""

    def __init__(self, size: int, floor: int) -> None:
        self.initial = size
        self.floor = min(floor, size)
        self.size = size
        self.shrinks = 0
        self._lock = threading.Lock()

    def shrink(self, failed_size: int) -> bool:
        """Halve below ``failed_size`` (the size that failed); False when that was already the floor."""
        with self._lock:
            if failed_size <= self.floor:
                return False
            smaller = max(self.floor, failed_size // 2)
            if smaller < self.size:
                self.size = smaller
                self.shrinks += 1
            return True
