"""Numbers written as text in a user's files (data lines, quoted values of cluster and profile files): ASCII only.

Python's ``int`` and ``float`` also read any Unicode decimal digit (``int("٣٣") == 33``), underscores
(``int("1_000") == 1000``) and surrounding whitespace (``int(" 12 ") == 12``).  None of those is a number in the
formats these files follow (PaddleRec's slot format, Paddle's MultiSlot text, YAML), so a reader that took them
would turn a corrupted or foreign file into wrong ids instead of an error.  One grammar each, here, for every
reader of such text.
"""

from __future__ import annotations

import re

# An optional minus: a negative id is refused by the reader's range check, which says why better than "not digits".
_INTEGER = re.compile(r"-?[0-9]+")
# What float() reads, minus underscores, whitespace and non-ASCII digits; nan/inf stay so readers can say
# "not finite" rather than "not a number".
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:nan|inf|infinity)", re.IGNORECASE)


def ascii_int(text: str) -> int:
    """``int(text)`` for ASCII digits with an optional leading minus; ValueError for anything else."""
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"not an ASCII integer: {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """``float(text)`` for an ASCII decimal (``1``, ``-2.5``, ``1e9``, ``.5``, ``nan``, ``inf``); ValueError for
    anything else."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"not an ASCII number: {text!r}")
    return float(text)
