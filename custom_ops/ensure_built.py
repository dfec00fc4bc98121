"""For tests: make sure the heterps_paddle that tests import has its native libraries.

When that package is this source checkout (``python -m pytest`` from the repository root), build
heterps_paddle/_ops in place if it is missing or older than the sources (``python setup.py build_ext
--inplace``).  When it is an installed copy (``pip install .`` then ``pytest``), pip built it; nothing to do.
``package_env()`` gives subprocesses the same package."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "heterps_paddle" / "_ops"
LIBS = ("libheterps_table.so", "heterps_ops.so")


def _newest_source() -> float:
    newest = (ROOT / "CMakeLists.txt").stat().st_mtime
    for sub in ("core", "paddle"):
        for path in (ROOT / "custom_ops" / sub).rglob("*"):
            if path.suffix in (".h", ".cc", ".cu", ".cuh"):
                newest = max(newest, path.stat().st_mtime)
    return newest


def stale() -> bool:
    if os.environ.get("HETERPS_OPS_DIR"):
        return False  # the caller points at prebuilt libraries
    libs = [OPS / name for name in LIBS]
    return not all(p.exists() for p in libs) or min(p.stat().st_mtime for p in libs) < _newest_source()


def package_root() -> Path:
    """The directory from which `import heterps_paddle` resolves in this process."""
    spec = importlib.util.find_spec("heterps_paddle")
    if spec is None or spec.origin is None:
        return ROOT
    return Path(spec.origin).resolve().parents[1]


def package_env(**extra) -> dict:
    """Environment for a subprocess that must import the same heterps_paddle as this process."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root()), os.environ.get("PYTHONPATH")) if p)
    return env


def ensure_built() -> None:
    if package_root() != ROOT or not stale():
        return
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".heterps-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several pytest processes may get here at once
        if stale():
            subprocess.run(
                [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                cwd=ROOT,
                check=True,
                stdout=subprocess.DEVNULL,
            )
