"""What `wandb-assets ui` and the demo's UI let through to the terminal from `dagster dev`'s stderr.

One known block is dropped: grpc's asyncio poller logs "Exception in callback ... PollerCompletionQueue._handle_events"
with a traceback ending in ``BlockingIOError`` or ``OSError: [Errno 9]`` when more than one event loop of a process
watches its notification socket (grpc/grpc#25364, #42357; the fix, grpc/grpc#36096, is unmerged). Dagster's webserver
and daemon run such loops; nothing fails, but a traceback in the first hour reads as "it is broken". Everything else
passes through unchanged, byte for byte and in order.
"""

from collections.abc import Iterable, Iterator

#: Text that marks a block as grpc's spurious poller error.
NOISE_MARKERS = (b"PollerCompletionQueue._handle_events",)
#: asyncio's default exception handler starts its report with this line.
BLOCK_START = b"Exception in callback"
#: A block longer than this is not the poller's (5 lines); it is let through as it is.
MAX_BLOCK_LINES = 40


def _block_ends(line: bytes) -> bool:
    """The exception's own line (``OSError: ...``) ends asyncio's report: not indented, not its header lines."""
    return not line[:1].isspace() and not line.startswith((b"handle:", b"Traceback", BLOCK_START))


def drop_known_noise(lines: Iterable[bytes]) -> Iterator[bytes]:
    """``lines`` without the blocks described above; a block is held only until its last line is read."""
    block: list[bytes] = []
    for line in lines:
        if not block:
            if line.startswith(BLOCK_START):
                block = [line]
            else:
                yield line
            continue
        block.append(line)
        if _block_ends(line):
            if not any(marker in held for held in block for marker in NOISE_MARKERS):
                yield from block
            block = []
        elif len(block) >= MAX_BLOCK_LINES:
            yield from block
            block = []
    yield from block
