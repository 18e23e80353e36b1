"""Worker processes for CPU-bound Python beside threads that wait on the network. No Dagster here.

A fetch's threads spend most of their time waiting, but normalising what they receive is pure Python, and the
GIL lets one thread compute at a time: a second core stays idle. ``ProcessPool`` hands calls to worker
processes instead. Each worker is ``python -m wandb_assets.lib.workers``, started with ``subprocess`` (not
``multiprocessing``, whose spawned children first import the parent's ``__main__``: the Dagster CLI, seconds of
imports): it imports only the modules of the functions it is handed. Calls and results cross a pipe as
length-prefixed pickles; a call that raises comes back as its exception's type and message.
"""

from __future__ import annotations

import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from wandb_assets.lib.errors import FetchWideError

#: How long ``ProcessPool.close(cancel=True)`` lets a busy worker finish its call before killing it.
CANCEL_GRACE_S = 5.0

_LENGTH = struct.Struct("!Q")


class WorkerError(FetchWideError):
    """A call failed in a worker process, or the worker itself died."""


def _send(stream: BinaryIO, payload: bytes) -> None:
    stream.write(_LENGTH.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream: BinaryIO) -> bytes | None:
    """One message, or None at the end of the stream (the other side closed it)."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    payload = stream.read(length)
    if len(payload) < length:
        return None
    return payload


class ProcessPool:
    """``processes`` worker processes, each fed by one thread of this process; ``submit`` blocks while
    ``backlog`` calls per process wait (what the pool holds in memory). The first failure is kept: later
    ``submit`` calls and ``close`` raise it."""

    def __init__(self, processes: int, backlog: int = 2) -> None:
        self.calls: queue.Queue = queue.Queue(maxsize=max(1, processes) * max(1, backlog))
        self.error: BaseException | None = None
        self.cancelled = False
        self.lock = threading.Lock()
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1 << 20
            )
            for _ in range(max(1, processes))
        ]
        self.feeders = [
            threading.Thread(target=self._feed, args=(process,), name=f"worker-feed-{n}", daemon=True)
            for n, process in enumerate(self.processes)
        ]
        for feeder in self.feeders:
            feeder.start()

    def submit(self, function: Callable[..., Any], args: tuple, on_result: Callable[[Any], None]) -> None:
        """Call ``function(*args)`` in a worker (a module-level function: it is sent by name); ``on_result`` gets
        what it returned, on a feeding thread."""
        self._raise_failure()
        self.calls.put((function, args, on_result))

    def _feed(self, process: subprocess.Popen) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            function, args, on_result = call
            try:
                if self.error is None and not self.cancelled:  # after a failure, calls are drained unrun
                    on_result(self._call(process, function, args))
            except BaseException as exc:  # noqa: BLE001 - kept for submit/close to raise
                with self.lock:
                    self.error = self.error or exc
            finally:
                self.calls.task_done()

    def _call(self, process: subprocess.Popen, function: Callable[..., Any], args: tuple) -> Any:
        try:
            _send(process.stdin, pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL))
            reply = _receive(process.stdout)
        except BrokenPipeError:
            reply = None
        if reply is None:
            raise WorkerError(f"A worker process exited (code {process.wait()}) during {function.__name__}.")
        ok, value = pickle.loads(reply)
        if not ok:
            raise WorkerError(f"{function.__name__} failed in a worker process: {value}")
        return value

    def _raise_failure(self) -> None:
        if self.error is not None:
            raise self.error

    def join(self) -> None:
        """Wait until every submitted call has finished; raise the first failure."""
        self.calls.join()
        self._raise_failure()

    def close(self, cancel: bool = False, grace_s: float = CANCEL_GRACE_S) -> None:
        """Stop the workers and reap them: calls still waiting run first, unless ``cancel`` or a call failed. With
        ``cancel``, a worker still busy after ``grace_s`` (hung) is killed: closing never waits on it for good."""
        self.cancelled = self.cancelled or cancel
        for _ in self.feeders:
            self.calls.put(None)
        deadline = time.monotonic() + grace_s if self.cancelled else None
        for feeder in self.feeders:
            feeder.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if any(feeder.is_alive() for feeder in self.feeders):  # a call that does not return: end its process
            for process in self.processes:
                process.kill()
            for feeder in self.feeders:
                feeder.join()
        for process in self.processes:
            try:
                process.stdin.close()
            except BrokenPipeError:  # it died with a call half sent
                pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()


def _serve() -> None:
    """A worker's loop: read a call, run it, write back ``(True, result)`` or ``(False, "Type: message")``."""
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a print in a called function cannot corrupt the replies
    while (payload := _receive(requests)) is not None:
        try:
            function, args = pickle.loads(payload)
            reply = (True, function(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which raises it
            reply = (False, f"{type(exc).__name__}: {exc}")
        _send(replies, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it cancels, then closes us)
    _serve()
