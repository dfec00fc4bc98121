"""The launch's board across hosts, as the coordinator serves it: who may write what.

The records themselves (rendezvous.py: BoardStore) are the plan the round runs, the side channels' endpoints, the
servers' word that they restored a checkpoint.  The rules here: the plan record is written once a round, by stage 1's
trainer 0's host (fleet/plan_agreement.py publishes it there); every record, and the board as a whole, is bounded.
A new round gets a new board, which the processes of an earlier round (stopping as it starts) cannot write.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping, Sequence

from heterps_paddle import control, rendezvous
from heterps_paddle.data_plan import DataPlan
from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.control_server import printable
from heterps_paddle.rendezvous import BoardStore

MAX_RECORD = control.MAX_LINE  # a board record (one line)
MAX_BOARD = 16 << 20  # the board, all records together
PLAN_KEY = rendezvous.PLAN_KEY


class Board:
    """One round's board: ``plan_writer`` is the host that may write its plan record."""

    def __init__(
        self, plan_writer: str, launch: str | None = None, trainers: Mapping[str, Sequence[int]] | None = None
    ):
        self.plan_writer = plan_writer
        self.launch = launch  # the round's launch id: a process of an earlier round writes nothing here
        # each host of the round -> the stage 1 CPU trainers it runs (their indices): the data plan takes a
        # trainer's requests only from its host (None: a board of no launch's round, which binds no sender)
        self.trainers = None if trainers is None else {h: tuple(ranks) for h, ranks in trainers.items()}
        self.store = BoardStore()
        self.data_plan = DataPlan()  # the round's passes' shards, handed to the trainers (data_plan.py)
        self.data_plan_lock = threading.Lock()  # the coordinator answers each connection in a thread of its own

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A board request (put / get / entries, or the data plan's), as the rules allow; an error answer names
        what was refused."""
        if message.get("op") == "shards":
            refused = self.sender_refused(message)
            if refused is not None:
                return {"error": refused}
            with self.data_plan_lock:  # one request at a time: a shard is handed to one trainer
                trainers = None if self.trainers is None else sum(len(r) for r in self.trainers.values())
                refused = rendezvous.shards_request_refused(message, list(self.data_plan.passes), trainers)
                return {"error": refused} if refused is not None else self.data_plan.answer(message)
        if message.get("op") == "put":
            key, host = message.get("key"), message.get("host")
            sender = message.get("launch")
            if self.launch is not None and isinstance(sender, str) and sender != self.launch:
                # its processes still running for a moment as a new round starts: their meters are not this round's
                return {"error": f"board record {key!r} from {host}: a process of another round (launch {sender:.16})"}
            if key == PLAN_KEY:
                if host != self.plan_writer:
                    return {
                        "error": f"the plan record is written by {self.plan_writer} (stage 1's trainer 0), not {host}"
                    }
                if self.published() is not None:
                    return {"error": f"the plan record of this round was written already (refused from {host})"}
            size = len(json.dumps(message.get("value")))
            if size > MAX_RECORD:
                return {"error": f"board record {key!r} from {host}: {size} bytes, over {MAX_RECORD}"}
            if self.store.size() + size > MAX_BOARD:
                return {"error": f"board record {key!r} from {host}: the board is full ({MAX_BOARD} bytes)"}
        try:
            return self.store.answer(message)
        except (KeyError, HeterPSError) as exc:
            return {"error": str(exc)}

    def sender_refused(self, message: Mapping[str, Any]) -> str | None:
        """Why a data plan request is not this round's to send (None: it is): a process of another round; and where
        the round's hosts are known, a request without the round's launch id, from a host not of the round, or for
        a trainer its host does not run."""
        sender = message.get("launch")
        if self.launch is not None and isinstance(sender, str) and sender != self.launch:
            return f"the data plan: a process of another round (launch {printable(sender)[:16]})"
        if self.trainers is None:
            return None
        if sender is None:
            return "the data plan: a request without a launch id (only this round's processes send it)"
        host, trainer = message.get("host"), message.get("trainer")
        if not isinstance(host, str) or host not in self.trainers:
            return f"the data plan: {printable(str(host))[:64]!r} is not a host of this round"
        if isinstance(trainer, bool) or trainer not in self.trainers[host]:
            runs = ", ".join(map(str, self.trainers[host])) or "none"
            return f"the data plan: {host} does not run trainer {printable(str(trainer))[:20]} (it runs {runs})"
        return None

    def get(self, key: str) -> Any | None:
        return self.store.answer({"op": "get", "key": key})["value"]

    def entries(self, prefix: str) -> dict[str, Any]:
        return dict(self.store.answer({"op": "entries", "prefix": prefix})["entries"])

    def published(self) -> Any | None:
        """The plan record of this round (fleet/plan_agreement.py), or None."""
        return self.store.answer({"op": "get", "key": PLAN_KEY})["value"]

    def cluster_types(self) -> list[str]:
        """The resource types of the cluster the published plan was made on ([] when it published none)."""
        cluster = ((self.published() or {}).get("inputs") or {}).get("cluster") or {}
        return [str(t.get("name")) for t in cluster.get("resource_types") or () if isinstance(t, Mapping)]
