"""Small file-system helpers shared by the data cache and the plan sharing: one home each."""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator


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


def write_atomic(path: str, text: str) -> None:
    """Write then rename, so a reader sees the old file or the whole new one, never half of it."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
