"""Progress bars of decoding: committed tokens for the eager loops, decoded blocks for the static host loops."""

from __future__ import annotations

import contextlib

from dare.progress import progress_bar as make_bar


def progress_bar(total: int, enabled: bool, unit: str = "tok"):
    """A transient "decoding" bar of ``total`` units (plain lines when stderr is not a terminal:
    :func:`dare.progress.progress_bar`), or None when not ``enabled``."""
    if not enabled:
        return None
    return make_bar(total, "decoding", unit=unit, leave=False)


@contextlib.contextmanager
def block_progress(blocks: int, enabled: bool):
    """A bar over ``blocks`` blocks for the static host loops (advanced once per block, on the host); yields the
    function that advances it (a no-op when not ``enabled``)."""
    bar = progress_bar(blocks, enabled, unit="block")
    try:
        yield (lambda: bar.update(1)) if bar is not None else (lambda: None)
    finally:
        if bar is not None:
            bar.close()
