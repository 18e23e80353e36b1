"""The filter on `dagster dev`'s stderr (lib/terminal.py): grpc's spurious poller traceback goes, all else stays."""
# ruff: noqa: E501  (the tracebacks below are verbatim terminal text)

from hypothesis import given
from hypothesis import strategies as st

from wandb_assets.lib.terminal import NOISE_MARKERS, drop_known_noise

# As the demo's terminal had it in CI (test_browser's terminal test failed on it), between two of our lines.
POLLER = b"""Exception in callback None()
handle: <Handle cancelled>
Traceback (most recent call last):
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/events.py", line 80, in _run
    self._context.run(self._callback, *self._args)
  File "src/python/grpcio/grpc/_cython/_cygrpc/aio/completion_queue.pyx.pxi", line 153, in grpc._cython.cygrpc.PollerCompletionQueue._handle_events
OSError: [Errno 9] Bad file descriptor
"""
# The variant of grpc/grpc#25364 (two loops, one byte).
POLLER_BLOCKING = b"""Exception in callback PollerCompletionQueue._handle_events(<_UnixSelecto...e debug=False>)()
handle: <Handle PollerCompletionQueue._handle_events(<_UnixSelecto...e debug=False>)()>
Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/events.py", line 80, in _run
    self._context.run(self._callback, *self._args)
  File "src/python/grpcio/grpc/_cython/_cygrpc/aio/completion_queue.pyx.pxi", line 147, in grpc._cython.cygrpc.PollerCompletionQueue._handle_events
BlockingIOError: [Errno 11] Resource temporarily unavailable
"""
# Another callback's failure is a real one: kept whole.
OTHER = b"""Exception in callback Server._on_request()
handle: <Handle Server._on_request()>
Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/events.py", line 80, in _run
ValueError: the code server answered nonsense
"""
BEFORE = b"2026-11-26 17:20:04 +0000 - dagster - INFO - runs - Loaded 664 staged runs\n"
AFTER = b"2026-11-26 17:21:10 +0000 - dagster - INFO - fleet_snapshot - Fleet snapshot at 2026-11-26T17:21:10Z\n"


def _filtered(text: bytes) -> bytes:
    return b"".join(drop_known_noise(text.splitlines(keepends=True)))


def test_the_poller_traceback_is_dropped_and_the_lines_around_it_kept():
    assert _filtered(BEFORE + POLLER + AFTER) == BEFORE + AFTER
    assert _filtered(POLLER_BLOCKING + POLLER + BEFORE) == BEFORE


def test_any_other_callback_traceback_is_kept_whole():
    assert _filtered(BEFORE + OTHER + POLLER + AFTER) == BEFORE + OTHER + AFTER


def test_a_block_cut_short_by_the_end_of_the_stream_is_let_through():
    cut = b"".join(OTHER.splitlines(keepends=True)[:3])
    assert _filtered(BEFORE + cut) == BEFORE + cut


_line = (
    st.binary(max_size=60)
    .map(lambda b: b.replace(b"\n", b" ") + b"\n")
    .filter(lambda line: not any(marker in line for marker in NOISE_MARKERS))  # "without the poller"
)


@given(st.lists(st.one_of(_line, st.sampled_from([OTHER, BEFORE, AFTER, b"Exception in callback x()\n"])), max_size=30))
def test_without_the_poller_nothing_changes(chunks):
    text = b"".join(chunks)
    assert _filtered(text) == text
