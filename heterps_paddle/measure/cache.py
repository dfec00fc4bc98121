"""Measurements taken once and reused: keyed by what they depend on, so the same inputs give the same plan.

A plan depends on measured figures (a program's per-layer times, this machine's speeds, the parameter servers'
cost per row).  Measured again at every launch they would move with the machine's load, and so would the plan.
So each is stored under ``$HETERPS_CACHE/measurements/`` with a key made of what it depends on (the program's
digest, the batch size...) plus the machine and the software (host, CPU model, cores, memory; Paddle's and this
package's versions): another program, another machine or an upgrade measures again; a rerun reuses.

Pure Python, no Paddle.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Mapping

import psutil

from heterps_paddle import settings
from heterps_paddle.files import locked, write_atomic
from heterps_paddle.version import __version__

CACHE_FORMAT = 1


def cache_root() -> str:
    return str(settings.get("HETERPS_CACHE"))


def paddle_version() -> str:
    """The installed Paddle's version, without importing Paddle."""
    for dist in ("paddlepaddle-gpu", "paddlepaddle"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What a measurement of this machine depends on."""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "paddle": paddle_version(),
        "heterps": __version__,
    }


def digest(value: Any) -> str:
    """A short stable digest of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Measurement:
    value: dict[str, Any]
    path: str
    measured_at: str  # ISO time of the measurement
    reused: bool  # read from the cache rather than measured now


def cached(
    kind: str,
    depends_on: Mapping[str, Any],
    measure: Callable[[], dict[str, Any]],
    refresh: bool = False,
    keep: Callable[[dict[str, Any]], bool] = lambda value: True,
) -> Measurement:
    """``measure()`` once per (kind, what it depends on, machine); later calls read the stored value.

    ``refresh``: measure again and replace it.  ``keep``: whether a fresh value may be stored (a measurement
    that partly failed is used once and measured again next time)."""
    root = os.path.join(cache_root(), "measurements")
    key = {"kind": kind, "depends_on": dict(depends_on), "machine": machine()}
    path = os.path.join(root, f"{kind}-{digest(key)}.json")
    with locked(root, f".{kind}.lock"):
        if not refresh and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    stored = json.load(f)
                if stored.get("format") == CACHE_FORMAT and stored.get("key") == json.loads(json.dumps(key)):
                    return Measurement(stored["value"], path, stored["measured_at"], True)
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable, or written by another version of this code: measure again
        value = measure()
        measured_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if keep(value):
            write_atomic(
                path,
                json.dumps(
                    {"format": CACHE_FORMAT, "key": key, "measured_at": measured_at, "value": value},
                    indent=1,
                    default=str,
                ),
            )
        return Measurement(value, path, measured_at, False)
