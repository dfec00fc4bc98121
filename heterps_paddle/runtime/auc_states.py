"""A model's AUC ops and their state variables, as Paddle 2.6.2's ``auc`` op lays them out, for whatever reads them
(runtime/stage_metrics.py: a split's last stage to its CPU trainers; runtime/meter.py: what a pass learned).

``paddle.static.auc(num_thresholds=T, slide_steps=S)`` appends two ``auc`` ops, each with a positive and a negative
state (int64 histograms over ``B = T + 1`` buckets of the predicted probability):

- the "batch" op, with the script's ``slide_steps``: for ``S > 0`` its state holds ``S`` windows of one batch each,
  then their sum (the window the op's AUC is computed from), then one batch counter: ``(S + 1) * B + 1`` entries;
  its histograms count only the last ``S`` batches (they do not accumulate);
- the "global" op, ``slide_steps = 0``: one histogram of ``B`` buckets that accumulates every sample.

For ``S = 0`` the batch op accumulates too, and its state has two sizes over the job: the startup program fills the
``(1 + S) * B + 1`` entries the Python layer declares, and the first batch's kernel makes it ``[1, B]`` (seen with
PaddleRec's DLRM and DeepFM, ``slide_steps=0``: 4097 entries, then 4096).  So the layout comes from each op's
attributes, and a state is read as its op's *counting window*: the ``B`` buckets the op's AUC is computed from.  A
state of any other size is not read: the reader says so once, naming the op, and goes on without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from heterps_paddle.log import logger


class UnreadableState(ValueError):
    """A state whose size is not one its op's layout gives."""


@dataclass(frozen=True)
class AucOp:
    auc: str  # the op's AUC output (what a script fetches)
    stat_pos: str
    stat_neg: str
    num_thresholds: int
    slide_steps: int

    @property
    def buckets(self) -> int:
        return self.num_thresholds + 1

    @property
    def accumulates(self) -> bool:
        """Whether its histograms count every sample since they were last zeroed (else the last batches only)."""
        return self.slide_steps == 0

    def sizes(self) -> tuple[int, ...]:
        """The sizes its state can have: what the kernel writes, and (``slide_steps = 0``) what startup declares."""
        declared = (1 + self.slide_steps) * self.buckets + 1
        return (self.buckets, declared) if self.slide_steps == 0 else (declared,)

    def window(self, name: str, state: Any) -> Any:
        """The counting window of one of its states as read (``UnreadableState``: a size its layout does not give)."""
        flat = np.asarray(state).reshape(-1)
        if flat.size not in self.sizes():
            raise UnreadableState(
                f"AUC op {self.auc} (num_thresholds={self.num_thresholds}, slide_steps={self.slide_steps}): its state "
                f"{name} has {flat.size} entries, its layout gives {' or '.join(map(str, self.sizes()))}"
            )
        start = self.slide_steps * self.buckets
        return flat[start : start + self.buckets].astype("int64")

    def states(self) -> tuple[str, str]:
        return self.stat_pos, self.stat_neg


def auc_ops(program: Any) -> list[AucOp]:
    """The program's AUC ops in program order, with the layout their attributes give."""
    return [
        AucOp(
            op.output("AUC")[0],
            op.output("StatPosOut")[0],
            op.output("StatNegOut")[0],
            int(op.attr("num_thresholds")),
            int(op.attr("slide_steps")),
        )
        for blk in program.blocks
        for op in blk.ops
        if op.type == "auc"
    ]


def accumulating(ops: list[AucOp]) -> list[AucOp]:
    return [op for op in ops if op.accumulates]


_SAID: set[str] = set()


def say_once(key: str, message: str) -> None:
    """A warning this process prints once (a reader polls every half second: one line says it)."""
    if key not in _SAID:
        _SAID.add(key)
        logger.warning("%s", message)


def windows(ops: list[AucOp], raw: dict[str, Any], why_missing: str) -> dict[str, Any]:
    """The counting windows of the states in ``raw`` (name -> state as read; None: not set yet), by state name.  A
    state that cannot be read is left out, said once with ``why_missing`` (what is not shown without it)."""
    out: dict[str, Any] = {}
    for op in ops:
        for name in op.states():
            value = raw.get(name)
            if value is None:
                continue
            try:
                out[name] = op.window(name, value)
            except UnreadableState as exc:
                say_once(f"unreadable {name}", f"{exc}: {why_missing}")
    return out
