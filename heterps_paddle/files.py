"""Small file-system helpers: one home each.

The file lock and the atomic write (the data cache, the plan sharing), and the checks of a command's path options:
``input_file``/``input_dir`` (must exist, of the right kind) and ``output_dir``/``output_file`` (a directory made if
missing, a file's directory made if missing, each writable).  Those raise ``CommandError`` with one line that names
the option, the path and what is wrong, so every bad path a user gives a ``heterps`` command is exit status 2 and
one line, never a traceback from an ``os.makedirs`` or an ``open`` deep in the work.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import Any, Callable, Iterator

from heterps_paddle.errors import CommandError


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


def new_lines(path: str, offset: int) -> tuple[int, list[str]]:
    """The whole lines written to ``path`` past byte ``offset``, and the offset after them (a line still being
    written waits for its end; a file that cannot be read has none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, []
    end = data.rfind(b"\n")
    if end < 0:
        return offset, []
    return offset + end + 1, data[:end].decode("utf-8", "replace").split("\n")


def pyplot(option: str = "--plot") -> Any:
    """matplotlib's pyplot on its file backend, for a command's ``option``; where the optional extra is not
    installed, a CommandError saying in one line what to install (the one check of every command's --plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommandError(
            f"{option} needs matplotlib, which is not installed: pip install 'heterps-paddle[plot]'"
        ) from None
    return plt


def save_figure_atomic(figure: Any, path: str, dpi: int = 100) -> None:
    """A matplotlib figure to ``path`` (format from its extension, png without one), by ``replace_atomic``."""
    kind = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    replace_atomic(path, lambda tmp: figure.savefig(tmp, dpi=dpi, format=kind))


def input_file(option: str, path: str) -> str:
    """``path``, given to ``option``, as a readable existing file; else ``CommandError``."""
    if os.path.isdir(path):
        raise CommandError(f"{option} {path}: is a directory, not a file")
    if not os.path.exists(path):
        raise CommandError(f"{option} {path}: file does not exist{_blocked_by_file(path)}")
    if not os.path.isfile(path):
        raise CommandError(f"{option} {path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise CommandError(f"{option} {path}: file is not readable")
    return path


def input_dir(option: str, path: str) -> str:
    """``path``, given to ``option``, as a readable existing directory; else ``CommandError``."""
    if not os.path.exists(path):
        raise CommandError(f"{option} {path}: directory does not exist{_blocked_by_file(path)}")
    if not os.path.isdir(path):
        raise CommandError(f"{option} {path}: is a file, not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise CommandError(f"{option} {path}: directory is not readable")
    return path


def output_dir(option: str, path: str) -> str:
    """``path``, given to ``option``, as a writable directory, made (with its parents) if missing; else
    ``CommandError``: a file there or above it, or a place where it cannot be made or written."""
    problem = _make_writable_dir(path)
    if problem:
        raise CommandError(f"{option} {path}: {problem}")
    return path


def output_file(option: str, path: str) -> str:
    """``path``, given to ``option``, as a file that can be written: not a directory, its directory made (with
    its parents) if missing and writable; else ``CommandError``."""
    if os.path.isdir(path):
        raise CommandError(f"{option} {path}: is a directory, not a file")
    if path.endswith(os.sep):
        raise CommandError(f"{option} {path}: names a directory (it ends with {os.sep}), not a file")
    directory = os.path.dirname(path) or os.curdir
    problem = _make_writable_dir(directory)
    if problem:
        raise CommandError(f"{option} {path}: {directory} {problem}")
    return path


def _nearest_existing(path: str) -> str:
    """``path`` or the nearest of its ancestors that exists (a file or a directory)."""
    path = os.path.normpath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path) or os.curdir
        if parent == path:
            break
        path = parent
    return path


def _blocked_by_file(path: str) -> str:
    """Why a path cannot exist, where an ancestor is a file: the tail of a 'does not exist' message."""
    above = _nearest_existing(path)
    return "" if os.path.isdir(above) else f" ({above} is a file, not a directory)"


def _make_writable_dir(path: str) -> str | None:
    """Make ``path`` a writable directory; what is wrong with it where it cannot be (a predicate: 'is ...',
    'cannot be made: ...'), else None."""
    if os.path.isdir(path):
        problem = _cannot_write_in(path)
        return problem and f"is not writable ({problem})"
    above = _nearest_existing(path)
    if above == os.path.normpath(path):
        return "is a file, not a directory"
    if not os.path.isdir(above):
        return f"cannot be made: {above} is a file, not a directory"
    problem = _cannot_write_in(above)
    if problem:
        return f"cannot be made: {above} is not writable ({problem})"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"cannot be made: {exc.strerror or exc}"
    return None


def _cannot_write_in(directory: str) -> str | None:
    """Why no file can be made in ``directory`` (the system's words), else None.  Found by making one and removing
    it: ``os.access`` says yes to root where modes say no, and to anyone on a file system that refuses new files
    (/proc)."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".heterps-write-check-", dir=directory)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(handle)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


# ------------------------------------------------------------------------------- a job's inputs are never written

# The files a launch was given, as ``heterps launch`` tells every process of its job: a JSON object
# of real path -> what it is (launch/options.py: LaunchOptions.inputs).
INPUTS_ENV = "HETERPS_INPUT_FILES"


def given_inputs(environ: Any = None) -> dict[str, str]:
    """The launch's inputs (``INPUTS_ENV``), real paths -> what each is; {} outside a launch or when unreadable."""
    text = (os.environ if environ is None else environ).get(INPUTS_ENV)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def overwritten_input(outputs: dict[str, str], inputs: dict[str, str]) -> str | None:
    """Why writing ``outputs`` (path -> what writes it) would write over one of ``inputs`` (path -> what it is),
    naming both; None when it would not."""
    by_path = {real(path): what for path, what in inputs.items()}
    for path, what in outputs.items():
        target = real(path)
        if target in by_path:
            return f"{what} ({path}) would write over {by_path[target]} ({target})"
    return None
