"""Reader for PaddleRec's Criteo slot format, and conversion to Paddle's MultiSlot text format.

A line of the slot format (80 real rows: tests/data/criteo_sample):

    click:0 dense_feature:0.0 ... (13 dense values) 1:737395 2:210498 ... 26:306163

Every line must have exactly one ``click`` (0 or 1), exactly 13 ``dense_feature`` values and at least
one id for each of the 26 sparse slots (a slot may repeat: multi-hot).  PaddleRec pads a missing slot
with zeros; we never do that, because a zero is a real feature id and a silent zero is wrong data.  A
malformed line stops the read with an error naming the file and line, or, when the caller asks for it,
is skipped and counted.  Bytes that are not UTF-8, and numbers not written in ASCII (``٣٣``, ``1_000``, which
Python's ``int`` reads as 33 and 1000), make a line malformed too.

Paddle's datasets read "MultiSlot" text (per slot: a count, then the values), so a slot-format file is
converted once (validated here, in Python, where errors can be reported properly) and the training job
feeds the converted file with ``pipe_command="cat"``, which is about twice as fast as a Python pipe
reader on this machine (see docs/paddle-notes.md).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import replace_atomic
from heterps_paddle.text_numbers import ascii_float, ascii_int

NUM_DENSE = 13
NUM_SPARSE = 26
LABEL_SLOT = "click"
DENSE_SLOT = "dense_feature"
SPARSE_SLOTS = tuple(str(i) for i in range(1, NUM_SPARSE + 1))
_SPARSE_INDEX = {name: i for i, name in enumerate(SPARSE_SLOTS)}
INT64_MAX = 2**63 - 1
# Bumped when the reader's rules change (2: ASCII-only numbers), so a conversion cached under older rules
# (data/dataset.py) is made again instead of feeding ids the reader now refuses.
READER_RULES = 2

# Names of the model inputs, in the order the converted MultiSlot lines carry them.  The example
# models create their feed variables in this same order (one home: this tuple).
DENSE_VAR = "dense_input"
SPARSE_VARS = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))
LABEL_VAR = "label"
FEED_ORDER = (DENSE_VAR,) + SPARSE_VARS + (LABEL_VAR,)


class DataFormatError(HeterPSError):
    """A data line that cannot be read; the message names the file and the line number."""


class MalformedLine(ValueError):
    """Why one line is malformed (without the file/line context, added by the caller)."""


@dataclass(frozen=True)
class Sample:
    label: int
    dense: tuple[float, ...]
    sparse: tuple[tuple[int, ...], ...]  # one tuple of ids per sparse slot, slot 1 first


def _parse_id(slot: str, text: str) -> int:
    try:
        value = ascii_int(text)  # not int(): it reads "٣٣" and "1_000" (heterps_paddle/text_numbers.py)
    except ValueError:
        raise MalformedLine(f"slot {slot}: id {text!r} is not an integer (ASCII digits 0-9 only)") from None
    if value < 0 or value > INT64_MAX:
        raise MalformedLine(f"slot {slot}: id {text} is outside 0..2^63-1")
    return value


def _parse_float(text: str) -> float:
    try:
        value = ascii_float(text)
    except ValueError:
        raise MalformedLine(f"{DENSE_SLOT}: {text!r} is not a number (ASCII decimal only)") from None
    if not math.isfinite(value):
        raise MalformedLine(f"{DENSE_SLOT}: {text!r} is not a finite number")
    return value


def parse_line(line: str) -> Sample:
    """Parse one slot-format line, raising MalformedLine with the reason."""
    label = None
    dense: list[float] = []
    sparse: list[list[int]] = [[] for _ in SPARSE_SLOTS]
    for token in line.split():
        name, sep, value = token.partition(":")
        if not sep or not name or not value:
            raise MalformedLine(f"bad token {token!r} (expected name:value)")
        if name == DENSE_SLOT:
            dense.append(_parse_float(value))
        elif name in _SPARSE_INDEX:
            sparse[_SPARSE_INDEX[name]].append(_parse_id(name, value))
        elif name == LABEL_SLOT:
            if label is not None:
                raise MalformedLine("more than one click value")
            if value not in ("0", "1"):
                raise MalformedLine(f"click must be 0 or 1, got {value!r}")
            label = int(value)
        else:
            raise MalformedLine(f"unknown slot {name!r} in token {token!r}")
    if label is None:
        raise MalformedLine("missing click")
    if len(dense) != NUM_DENSE:
        raise MalformedLine(f"expected {NUM_DENSE} dense_feature values, got {len(dense)}")
    missing = [SPARSE_SLOTS[i] for i, ids in enumerate(sparse) if not ids]
    if missing:
        raise MalformedLine(f"missing sparse slot(s) {', '.join(missing)}")
    return Sample(label, tuple(dense), tuple(tuple(ids) for ids in sparse))


@dataclass
class ReadReport:
    """What a read did: rows read, and the malformed lines it skipped (only when asked to skip)."""

    rows: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)  # a few "file:line: reason", for the user

    def add_skip(self, where: str, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason.split(":")[0]] += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(f"{where}: {reason}")

    def merge(self, other: ReadReport) -> None:
        self.rows += other.rows
        self.skipped += other.skipped
        self.reasons.update(other.reasons)
        self.first_errors.extend(other.first_errors[: 5 - len(self.first_errors)])


def read_samples(path: str, skip_malformed: bool = False, report: ReadReport | None = None) -> Iterator[Sample]:
    """Yield the samples of one slot-format file.

    A malformed line raises DataFormatError("path:line: reason"), or with ``skip_malformed`` is
    counted in ``report`` and skipped.  Blank lines are ignored.
    """
    report = report if report is not None else ReadReport()
    with open(path, "rb") as f:  # decoded line by line, so a bad byte is reported at its own line
        for lineno, raw in enumerate(f, start=1):
            try:
                # An undecodable line is one more malformed line: skipped and counted like the others.
                sample = _parse_raw(raw)
            except MalformedLine as exc:
                if not skip_malformed:
                    raise DataFormatError(f"{path}:{lineno}: {exc}") from None
                report.add_skip(f"{path}:{lineno}", str(exc))
                continue
            if sample is not None:
                report.rows += 1
                yield sample


def _parse_raw(raw: bytes) -> Sample | None:
    """One line as read from the file: None for a blank line, MalformedLine for bytes that are not UTF-8."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedLine(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    return parse_line(line) if line.strip() else None


def format_multislot(sample: Sample) -> str:
    """One MultiSlot text line, slots in FEED_ORDER."""
    parts = [str(NUM_DENSE), " ".join(repr(v) for v in sample.dense)]
    for ids in sample.sparse:
        parts.append(str(len(ids)))
        parts.append(" ".join(map(str, ids)))
    parts.append("1")
    parts.append(str(sample.label))
    return " ".join(parts)


def convert_file(src: str, dst: str, skip_malformed: bool = False) -> ReadReport:
    """Validate ``src`` (slot format) and write it as MultiSlot text to ``dst`` atomically.

    On an error nothing is left at ``dst`` (the partial output is removed), so a later run never
    mistakes half a file for a converted one.
    """
    report = ReadReport()

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as out:
            for sample in read_samples(src, skip_malformed, report):
                out.write(format_multislot(sample))
                out.write("\n")

    replace_atomic(dst, write)
    return report


def read_all(paths: Sequence[str], skip_malformed: bool = False) -> tuple[list[Sample], ReadReport]:
    report = ReadReport()
    samples: list[Sample] = []
    for path in paths:
        samples.extend(read_samples(path, skip_malformed, report))
    return samples, report
