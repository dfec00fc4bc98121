"""What a data plan request may hold: every count, size and pass number bounded, each refused by name.

The coordinator answers any holder of the job key; a request must not make it build a list of a billion trainers
or end the round's plan with a far-off pass number.  The bounds are far above a real job's (a thousand trainers,
a hundred thousand shards a pass) and far below what would hurt the coordinator.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from heterps_paddle.errors import HeterPSError

MAX_TRAINERS = 100_000  # stage 1 CPU trainers of a pass
MAX_PASS = 1 << 31  # the largest pass number
MAX_NAME = 4096  # characters of a shard's name, or of a path (PATH_MAX)
MAX_SHARDS = 1_000_000  # shards a pass, all trainers' offers together (and names a resume says done)
MAX_PAGES = 100_000  # pages of one trainer's offer
MAX_WANT = 1024  # shards a take asks for (one a reader thread of the dataset)
MAX_ASK = 1024  # characters of a checkpoint's ask
MAX_BYTES = 1 << 62  # bytes a progress report says trained
MIN_RANGE_BYTES = 4096  # the smallest range an offer may ask its large files cut into (a page)
# bytes of names a page of the ``done`` reply carries: under the control line's limit (control.MAX_LINE, 1 MiB)
# with room for the reply's other fields and JSON's quotes
DONE_PAGE_BYTES = 768 << 10


class DataPlanError(HeterPSError, ValueError):
    """A request the data plan refuses (an unknown trainer, a shard not held, a malformed or oversized message)."""


def integer(message: Mapping[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    """``message[key]``, an integer in ``[low, high]`` (``default`` where it is absent and there is one)."""
    value = message.get(key, default)
    if value is None:
        raise DataPlanError(f"data plan: malformed request: no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataPlanError(f"data plan: malformed request: {key!r} is {value!r}, not an integer")
    if not low <= value <= high:
        raise DataPlanError(f"data plan: {key!r} is {value}, outside [{low}, {high}]")
    return value


def seconds(message: Mapping[str, Any], key: str, default: float) -> float:
    """``message[key]``, a finite number (the plan's clock), ``default`` where it is absent."""
    value = message.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DataPlanError(f"data plan: malformed request: {key!r} is {value!r}, not a finite number")
    return float(value)


def text(value: Any, what: str, limit: int = MAX_NAME) -> str:
    """``value``, a string of at most ``limit`` characters (``what`` names it in the error)."""
    if not isinstance(value, str):
        raise DataPlanError(f"data plan: malformed request: {what} is {value!r}, not a string")
    if len(value) > limit:
        raise DataPlanError(f"data plan: {what} of {len(value)} characters, over {limit}: {value[:80]}...")
    return value


def names(value: Any, what: str, limit: int) -> list[str]:
    """``value``, a list of at most ``limit`` names."""
    if not isinstance(value, list):
        raise DataPlanError(f"data plan: malformed request: {what} is not a list")
    if len(value) > limit:
        raise DataPlanError(f"data plan: {what}: {len(value)} names, over {limit}")
    return [text(v, f"a name of {what}") for v in value]


def pairs(value: Any, what: str, limit: int) -> list[tuple[str, str]]:
    """``value``, a list of at most ``limit`` ``[name, path]`` pairs."""
    if not isinstance(value, list):
        raise DataPlanError(f"data plan: malformed request: {what} is not a list")
    if len(value) > limit:
        raise DataPlanError(f"data plan: {what}: {len(value)} files, over {limit}")
    out = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise DataPlanError(f"data plan: malformed request: {what} holds {pair!r}, not a [name, path] pair")
        out.append((text(pair[0], f"a name of {what}"), text(pair[1], f"a path of {what}")))
    return out
