"""A data plan kept in files on one host (a launch without a coordinator: rendezvous.FileBoard), without the whole
state rewritten for each request.

The directory holds a snapshot (``data-plan.json``: the plan's JSON and its generation) and a journal of the
requests answered since (``data-plan.<generation>.requests``, a JSON line each, its clock ``now`` stamped).  Each
process keeps the plan in memory: under the caller's lock it replays the lines other processes appended since its
last request, answers, and appends its own.  The plan answers deterministically, so every process holds the same
plan.  When the journal grows past the snapshot (at least :data:`COMPACT_BYTES`), the process writes a new
snapshot of the next generation and starts its journal; the others see their journal gone and read the snapshot.
A ``done`` request changes nothing and is not written.  Measured in docs/data-plan.md: the whole state rewritten
for each request cost seconds at 100,000 shards.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from heterps_paddle.data_plan.bounds import DataPlanError
from heterps_paddle.data_plan.plan import DataPlan

SNAPSHOT = "data-plan.json"
COMPACT_BYTES = 1 << 20  # the least journal worth a new snapshot


class PlanFiles:
    """The data plan in ``directory``, as this process last read it; every call under the directory's lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.plan: DataPlan | None = None
        self.generation = 0
        self.offset = 0  # bytes of the journal replayed
        self.snapshot_bytes = 0

    def journal(self, generation: int | None = None) -> str:
        number = self.generation if generation is None else generation
        return os.path.join(self.directory, f"data-plan.{number}.requests")

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """``message`` answered by the plan as every process's requests so far left it (the caller holds the
        lock)."""
        plan = self._catch_up()
        stamped = {**message, "now": message.get("now", time.time())}  # a replay answers at the same clock
        reply = plan.answer(stamped)
        if stamped.get("do") != "done":
            line = (json.dumps(stamped) + "\n").encode()
            with open(self.journal(), "ab") as f:
                f.write(line)
            self.offset += len(line)
            if self.offset > max(COMPACT_BYTES, self.snapshot_bytes):
                self._compact(plan)
        return reply

    def _catch_up(self) -> DataPlan:
        if self.plan is None or not os.path.exists(self.journal()):
            self._load()
        assert self.plan is not None
        try:
            with open(self.journal(), "rb") as f:
                f.seek(self.offset)
                written = f.read()
        except FileNotFoundError:
            written = b""
        if written and not written.endswith(b"\n"):
            raise DataPlanError(f"data plan: {self.journal()} ends in a partial line (a writer died writing it)")
        for line in written.splitlines():
            self.plan.answer(json.loads(line))
        self.offset += len(written)
        return self.plan

    def _load(self) -> None:
        path = os.path.join(self.directory, SNAPSHOT)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            self.plan, self.generation, self.offset, self.snapshot_bytes = DataPlan(), 0, 0, 0
            return
        value = json.loads(text)
        self.plan = DataPlan.from_json(value["plan"])
        self.generation, self.offset, self.snapshot_bytes = int(value["generation"]), 0, len(text)

    def _compact(self, plan: DataPlan) -> None:
        text = json.dumps({"generation": self.generation + 1, "plan": plan.to_json()})
        path = os.path.join(self.directory, SNAPSHOT)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        old = self.journal()
        self.generation, self.offset, self.snapshot_bytes = self.generation + 1, 0, len(text)
        open(self.journal(), "wb").close()
        os.remove(old)
