"""For tests in a source checkout: build heterps_paddle/_ops in place when it is missing or older than
the sources (`python setup.py build_ext --inplace`).  Installed packages never use this; they are built
by pip at install time."""

from __future__ import annotations

import fcntl
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


def ensure_built() -> None:
    if not stale():
        return
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".heterps-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several pytest processes may get here at once
        if stale():
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
