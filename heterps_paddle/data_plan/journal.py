"""A data plan kept in files on one host (a launch without a coordinator: rendezvous.FileBoard), without the whole
state rewritten for each request.

The directory holds a snapshot (``data-plan.json``: the plan's JSON and its generation) and a journal of the
requests answered since (``data-plan.<generation>.requests``, a JSON line each, its clock ``now`` stamped).  Each
process keeps the plan in memory: under the caller's lock it replays the lines other processes appended since its
last request, answers, and appends its own.  The plan answers deterministically, so every process holds the same
plan.  When the journal grows past the snapshot (at least :data:`COMPACT_BYTES`), the process writes a new
snapshot of the next generation (a rename: a reader sees the old one or the new one) and starts its journal; the
others see the snapshot replaced (another file) and read it.  A ``done`` request changes nothing and is not written,
nor is a request the plan refused.  A line a killed process left half-written was never answered: it is cut off.
Measured in docs/data-plan.md: the whole state rewritten for each request cost seconds at 100,000 shards.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from typing import Any, Callable, Mapping

from heterps_paddle.data_plan.plan import DataPlan

SNAPSHOT = "data-plan.json"
JOURNAL = re.compile(r"data-plan\.(\d+)\.requests")
COMPACT_BYTES = 1 << 20  # the least journal worth a new snapshot

logger = logging.getLogger(__name__)


def _identity(path: str) -> tuple[int, int] | None:
    """Which file is at ``path`` now (a rename or a new file is another), None for none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def remove(directory: str) -> None:
    """The data plan kept in ``directory`` gone (a new round of a kept board starts its passes again)."""
    shutil.rmtree(directory, ignore_errors=True)


class PlanFiles:
    """The data plan in ``directory``, as this process last read it; every call under the directory's lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.plan: DataPlan | None = None
        self.generation = 0
        self.offset = 0  # bytes of the journal replayed
        self.snapshot_bytes = 0
        self.read_from: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)  # snapshot, journal

    def journal(self, generation: int | None = None) -> str:
        number = self.generation if generation is None else generation
        return os.path.join(self.directory, f"data-plan.{number}.requests")

    def current(self) -> DataPlan:
        """The plan as every process's requests so far left it (the caller holds the lock)."""
        return self._catch_up()

    def answer(
        self, message: Mapping[str, Any], refused: Callable[[DataPlan], str | None] = lambda plan: None
    ) -> dict[str, Any]:
        """``message`` answered by the plan as every process's requests so far left it, unless ``refused(plan)``
        names why not (the caller holds the lock)."""
        plan = self._catch_up()
        why = refused(plan)
        if why is not None:
            return {"error": why}
        stamped = {**message, "now": message.get("now", time.time())}  # a replay answers at the same clock
        reply = plan.answer(stamped)
        if stamped.get("do") != "done" and "error" not in reply:
            os.makedirs(self.directory, exist_ok=True)
            line = (json.dumps(stamped) + "\n").encode()
            with open(self.journal(), "ab") as f:
                f.write(line)
            self.offset += len(line)
            self.read_from = (self.read_from[0], _identity(self.journal()))
            if self.offset > max(COMPACT_BYTES, self.snapshot_bytes):
                self._compact(plan)
        return reply

    def _catch_up(self) -> DataPlan:
        snapshot = _identity(os.path.join(self.directory, SNAPSHOT))
        journal = _identity(self.journal())
        if self.plan is None or (snapshot, journal) != self.read_from:  # replaced, removed or started anew
            self._load()
            journal = _identity(self.journal())
        assert self.plan is not None
        try:
            with open(self.journal(), "rb") as f:
                f.seek(self.offset)
                written = f.read()
        except FileNotFoundError:
            written = b""
        if written and not written.endswith(b"\n"):
            # under the lock: the process that wrote it died writing it, and its request was never answered
            whole = written[: written.rfind(b"\n") + 1]
            os.truncate(self.journal(), self.offset + len(whole))
            logger.warning(
                "data plan: %s ended in a half-written request (%d bytes; its writer died before answering): cut off",
                self.journal(),
                len(written) - len(whole),
            )
            written = whole
        for line in written.splitlines():
            self.plan.answer(json.loads(line))
        self.offset += len(written)
        self.read_from = (self.read_from[0], journal)
        return self.plan

    def _load(self) -> None:
        path = os.path.join(self.directory, SNAPSHOT)
        try:
            with open(path, encoding="utf-8") as f:
                snapshot, text = _identity_of_open(f), f.read()
        except FileNotFoundError:
            self.plan, self.generation, self.offset, self.snapshot_bytes = DataPlan(), 0, 0, 0
            self.read_from = (None, None)
            return
        value = json.loads(text)
        self.plan = DataPlan.from_json(value["plan"])
        self.generation, self.offset, self.snapshot_bytes = int(value["generation"]), 0, len(text)
        self.read_from = (snapshot, None)

    def _compact(self, plan: DataPlan) -> None:
        generation = self.generation + 1
        text = json.dumps({"generation": generation, "plan": plan.to_json()})
        path = os.path.join(self.directory, SNAPSHOT)
        open(self.journal(generation), "wb").close()  # the new journal before the snapshot that names it
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        self.generation, self.offset, self.snapshot_bytes = generation, 0, len(text)
        self.read_from = (_identity(path), _identity(self.journal()))
        for name in os.listdir(self.directory):  # older journals (one a killed compaction left, too)
            found = JOURNAL.fullmatch(name)
            if found and int(found.group(1)) < generation:
                os.remove(os.path.join(self.directory, name))


def _identity_of_open(f: Any) -> tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_dev, st.st_ino
