"""prefzoo._filelock: one process's lock is seen by another open of the same file, and released after the block."""

from __future__ import annotations

import pytest

from prefzoo._filelock import file_lock

fcntl = pytest.importorskip("fcntl")


def _busy(f) -> None:
    f.seek(0)  # "a+" opens at the end
    raise RuntimeError(f"busy: {f.read()!r}")


def test_a_held_lock_calls_on_busy_and_is_released_after_the_block(tmp_path) -> None:
    path = tmp_path / "made" / "x.lock"  # the folder is created
    with file_lock(path) as f:
        f.write("holder 1")
        f.flush()
        with pytest.raises(RuntimeError, match="busy: 'holder 1'"), file_lock(path, on_busy=_busy):
            pass
    with file_lock(path, on_busy=_busy) as g:
        assert g is not None
