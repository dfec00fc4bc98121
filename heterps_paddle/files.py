"""Small file-system helpers shared by the data cache and the plan sharing: one home each."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def locked(directory: str, name: str = ".lock") -> Iterator[None]:
    """Hold an exclusive lock on ``directory/name`` (created if needed) across processes of this host."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def replace_atomic(path: str, write: Callable[[str], None]) -> None:
    """``write(temporary path)`` then rename it to ``path``, so a reader sees the old file or the whole new one,
    never half of it (a process killed mid-write leaves no partial file)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str, text: str) -> None:
    """Write text then rename (``replace_atomic``)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    replace_atomic(path, write)


def save_figure_atomic(figure: Any, path: str, dpi: int = 100) -> None:
    """A matplotlib figure to ``path`` (format from its extension, png without one), by ``replace_atomic``."""
    kind = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    replace_atomic(path, lambda tmp: figure.savefig(tmp, dpi=dpi, format=kind))
