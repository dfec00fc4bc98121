"""The job's data plan: each training pass's shards, handed to the stage 1 CPU trainers as they are ready for one.

A trainer does not train a share fixed by its script: it offers the files its script gave it, the pass is cut from
the union of every trainer's files, and each trainer takes the next shard when it has trained the last, so a fast
trainer trains more shards and a slow one fewer, with no barrier between shards (DLRover's job master hands out its
data shards the same way: todo, doing, done).  A shard is a data file, named by its content
(runtime/file_identity.py: base name, bytes, SHA-256), so the same file under two paths (two hosts' mounts, two
trainers' copies) is one shard, trained once.

:class:`DataPlan` is the whole state, pure and JSON-shaped: the launch's coordinator holds one per round and answers
the trainers' requests with it (launch/board.py), a launch on one host keeps it in a file under a lock
(rendezvous.FileBoard).  Its rules:

- **A pass's shards** are the files every trainer offered for it, handed out from the first offer on (a trainer
  that finds none left is told to ``wait`` until every trainer offered: a pass starts without a barrier, and ends
  for a trainer only once its whole union is known).  A shard a checkpoint the round resumed from says done is not
  handed out; a file offered twice (two trainers, two paths, one content) is one shard.
- **take** hands the next shards not done and not held to a trainer (as many as it has reader threads), each with
  a path it offered for it when it did (else another trainer's: the trainer gives it back ``unreadable`` when it
  cannot read it there, and it is not handed to that trainer again); ``end`` once none is left for it.
- **A checkpoint inside a pass** (:meth:`PassShards.hold`): no shard is handed out from then; each trainer, asking
  for its next ones with none in hand, is told ``meet`` once (once all are told, every trainer holds none: the
  shards done are exactly what the model holds, K of the pass's S, K the shards done or in hand at the ask),
  ``wait`` after, until every trainer was told.  Refused once a trainer ended the pass (the pass's end is near, and
  the checkpoint comes there), with no shard left to hand out, with none taken since the last one, or for an ask
  it honoured already.

Pure Python, no Paddle: the coordinator imports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from heterps_paddle.errors import HeterPSError

# The least a call trains, at the trainer's pace, where the pass's shards are small: each call costs Paddle 0.1-0.3 s
# of its own (its trainer's end flushes the parameter-server client, which sleeps 100 ms first: docs/data-plan.md),
# 1-3% of a call of 10 s.
CALL_S = 10.0
KEPT_PASSES = 2  # a pass's state is kept while a trainer may still ask about it (the one before the newest)


def size_of(name: str) -> int:
    """A shard's bytes, from its content name (``<base name>:<bytes>:<sha256>``); 1 for a name by path (a file
    that is not local: all such shards count alike)."""
    parts = name.rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 1


class DataPlanError(HeterPSError, ValueError):
    """A request the data plan refuses (an unknown trainer, a shard not held, a malformed message)."""


@dataclass
class PassShards:
    """One pass's shards: ``trainers`` take them; a shard is its content name, ``paths`` where each trainer that
    offered it sees it."""

    number: int
    trainers: int
    offered: dict[int, list[list[str]]] = field(default_factory=dict)  # trainer -> [[name, path], ...]
    order: list[str] = field(default_factory=list)  # the shards in the order they are handed out
    paths: dict[str, dict[int, str]] = field(default_factory=dict)  # name -> {trainer: path}
    done: list[str] = field(default_factory=list)
    done_before: list[str] = field(default_factory=list)  # done by the checkpoint the round resumed from
    doing: dict[str, int] = field(default_factory=dict)  # name -> the trainer training it
    trained_by: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, list[int]] = field(default_factory=dict)
    ended: list[int] = field(default_factory=list)
    # the checkpoint inside this pass asked last: the shards done or in hand then (all done once the trainers meet:
    # its K of the pass's S), and the trainers still to be told to meet for it
    held_at: int = 0
    holding: list[int] = field(default_factory=list)
    asks_honoured: list[str] = field(default_factory=list)
    # trainers whose paths another trainer has trained a shard at (what they offered others can read)
    shared_from: list[int] = field(default_factory=list)
    taken_at: dict[str, float] = field(default_factory=dict)  # name -> when it was handed out (the plan's clock)
    # trainer -> bytes a second over its last call (its shards' bytes over the time from their take to their finish)
    rates: dict[int, float] = field(default_factory=dict)

    @property
    def opened(self) -> bool:
        return len(self.offered) == self.trainers

    def offer(self, trainer: int, files: list[list[str]], done_before: list[str]) -> None:
        """Trainer ``trainer``'s files for this pass (``[name, path]`` pairs); ``done_before``: the shards the
        checkpoint this round resumed from holds (every trainer says the same)."""
        self._check_trainer(trainer)
        if trainer in self.offered:
            if self.offered[trainer] != files:
                raise DataPlanError(f"pass {self.number}: trainer {trainer} offered other files a second time")
            return
        self.offered[trainer] = [list(pair) for pair in files]
        for name, path in files:
            if name not in self.paths:
                self.paths[name] = {}
                self.order.append(name)
            self.paths[name].setdefault(trainer, path)
        for name in done_before:
            if name not in self.done_before:
                self.done_before.append(name)

    def take(self, trainer: int, want: int = 1, now: float = 0.0, least: int = 0) -> dict[str, Any]:
        """What ``trainer``, holding no shard now, does next: ``shards`` (``want`` of them, one a reader thread, and
        more while the call would train less than :data:`CALL_S`; each its name and a path), ``wait``, ``meet`` (a checkpoint inside the pass, ``hold`` its number) or
        ``end`` (none left for it, or it would still train one when the others have trained all: a straggler's
        tail).  ``now``: the plan's clock (seconds), which times each trainer's shards; ``least``: the bytes a call
        is to train at least, where there are (the script's print_period of batches: its progress lines)."""
        self._check_trainer(trainer)
        if want < 1:
            raise DataPlanError(f"pass {self.number}: trainer {trainer} wants {want} shards")
        held = [name for name, who in self.doing.items() if who == trainer]
        if held:
            raise DataPlanError(f"pass {self.number}: trainer {trainer} asks for shards holding {held[0]}")
        if trainer in self.holding:
            self.holding.remove(trainer)
            return {"meet": self.held_at, "shards_in_pass": len(self.order)}
        if self.holding:
            return {"wait": f"pass {self.number}: the trainers meet for a checkpoint after {self.held_at} shards"}
        taken: list[list[str]] = []
        # its own files first (read where it offered them), then the others'
        for name in sorted(self.order, key=lambda n: trainer not in self.paths[n]):
            names = [n for n, _ in taken]
            if len(taken) >= want and sum(map(size_of, names)) >= least and not self._longer_call(trainer, names):
                break
            if self._free(name) and trainer not in self.unreadable.get(name, []):
                if not taken and self._outpaced(trainer, name):
                    break
                taken.append([name, self.paths[name].get(trainer, next(iter(self.paths[name].values())))])
        for name, _ in taken:
            self.doing[name] = trainer
            self.taken_at[name] = now
        if taken:
            return {"shards": taken}
        if not self.opened:  # more shards may come with the files still to be offered
            return {"wait": f"pass {self.number}: {self.trainers - len(self.offered)} trainer(s) to offer their files"}
        mine = [n for n, who in self.doing.items() if trainer in self.paths[n] and not self._read_by_others(n, who)]
        if mine:  # another trainer holds a file of this one's that may prove unreadable there: it may come back
            return {"wait": f"pass {self.number}: trainer {self.doing[mine[0]]} has this trainer's file {mine[0]}"}
        if trainer not in self.ended:
            self.ended.append(trainer)
        left = [n for n in self.order if self._free(n)]
        if left and len(self.ended) == self.trainers:
            raise DataPlanError(
                f"pass {self.number}: every trainer ended with {len(left)} shard(s) none could take ({left[0]}, "
                f"offered at {', '.join(sorted(set(self.paths[left[0]].values())))})"
            )
        return {"end": self.number}

    def _longer_call(self, trainer: int, taken: list[str]) -> bool:
        """Whether ``trainer``'s call, of the shards ``taken``, is to take one more: while it would train for less
        than :data:`CALL_S` at its pace, and the shards left after it would keep every trainer busy for more than
        :data:`CALL_S` (the pass's tail is handed out a shard a reader thread, so that no one holds much of it)."""
        mine = self.rates.get(trainer)
        if mine is None or len(self.rates) < self.trainers:
            return False
        if sum(size_of(n) for n in taken) / mine >= CALL_S:
            return False
        left = sum(size_of(n) for n in self.order if self._free(n) and n not in taken)
        return left / sum(self.rates.values()) > CALL_S

    def _outpaced(self, trainer: int, name: str) -> bool:
        """Whether ``trainer`` would still be training the shard ``name`` when the others, at their last calls'
        pace, have trained every shard left and this one too: then it takes none (a slow trainer's last shard
        would bound the pass, the straggler's tail).  Only once every trainer's pace is known."""
        others = [t for t in range(self.trainers) if t != trainer and t not in self.ended]
        paces = [self.rates.get(t) for t in others]
        mine = self.rates.get(trainer)
        if mine is None or not others or any(p is None for p in paces) or self.unreadable:
            return False  # (a shard some trainer cannot read: it may be this one's to train)
        if any(
            set(self.paths[n]) == {trainer} and not self._read_by_others(n) for n in self.order if not self._finished(n)
        ):
            return False  # a file only it offered, no other trainer shown to read: it may be this one's to train
        left = sum(size_of(n) for n in self.order if self._free(n))
        left += sum(size_of(n) for n, who in self.doing.items() if who != trainer)
        return size_of(name) / mine > left / sum(p for p in paces if p is not None)

    def finish(self, trainer: int, names: list[str], now: float = 0.0) -> None:
        """``trainer`` trained the shards ``names`` (one call's): its pace is their bytes over the time since their
        take."""
        for name in names:
            self._release(trainer, name)
        for name in names:
            self.done.append(name)
            self.trained_by[name] = trainer
            for offerer in self.paths[name]:
                if trainer not in self.paths[name] and offerer not in self.shared_from:
                    self.shared_from.append(offerer)
        took = now - min(self.taken_at.pop(name, now) for name in names) if names else 0.0
        if took > 0:
            self.rates[trainer] = sum(size_of(n) for n in names) / took

    def give_back(self, trainer: int, name: str, unreadable: bool) -> None:
        """``trainer`` hands the shard ``name`` back untrained (it cannot read it where it was told, or it stops)."""
        self._release(trainer, name)
        if unreadable:
            self.unreadable.setdefault(name, []).append(trainer)
            if all(t in self.unreadable[name] for t in range(self.trainers)):
                raise DataPlanError(
                    f"pass {self.number}: no trainer can read shard {name} (offered at "
                    f"{', '.join(sorted(set(self.paths[name].values())))})"
                )

    def hold(self, ask: str) -> str | None:
        """A checkpoint inside the pass, for ``ask`` (an ask's text, or the minutes it is due by); None when it
        holds (at the shards done or in hand: :attr:`held_at`), else why it is refused."""
        if not self.opened:
            return "not every trainer offered its files yet"
        if self.holding:
            return "a checkpoint inside the pass is under way"
        if ask in self.asks_honoured:
            return "honoured already"
        if self.ended:
            return "a trainer ended the pass: the checkpoint comes at its end"
        if not any(self._free(name) for name in self.order):
            return "no shard left to hand out: the checkpoint comes at the pass's end"
        before = len((set(self.done_before) & set(self.order)) - set(self.done))
        at = before + len(self.done) + len(self.doing)
        if at <= max(self.held_at, before):
            return "no shard taken since the pass began or its last checkpoint"
        self.held_at = at
        self.holding = list(range(self.trainers))
        self.asks_honoured.append(ask)
        return None

    def _read_by_others(self, name: str, holder: int | None = None) -> bool:
        """Whether a trainer other than those that offered ``name`` has trained a shard at one of their paths (the
        same storage, then), or ``holder`` offered it itself."""
        offerers = set(self.paths[name])
        if holder is not None and holder in offerers:
            return True
        return any(o in self.shared_from for o in offerers)

    def _finished(self, name: str) -> bool:
        return name in self.done or name in self.done_before

    def done_names(self) -> list[str]:
        """Every shard of the pass done: before the resume, and in this round."""
        return sorted(set(self.done_before) | set(self.done))

    def _free(self, name: str) -> bool:
        return name not in self.doing and name not in self.done and name not in self.done_before

    def _release(self, trainer: int, name: str) -> None:
        self._check_trainer(trainer)
        if self.doing.get(name) != trainer:
            raise DataPlanError(f"pass {self.number}: trainer {trainer} does not hold shard {name!r}")
        del self.doing[name]

    def _check_trainer(self, trainer: int) -> None:
        if not 0 <= trainer < self.trainers:
            raise DataPlanError(f"pass {self.number}: no trainer {trainer} among {self.trainers}")


class DataPlan:
    """Every pass of a round (the newest :data:`KEPT_PASSES`), answering the trainers' requests."""

    def __init__(self, passes: Mapping[int, PassShards] | None = None) -> None:
        self.passes: dict[int, PassShards] = dict(passes or {})

    def answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """One request: ``{"op": "shards", "do": offer|take|finish|give_back|hold|done, "pass": N, ...}``; an
        ``error`` answer names what was refused."""
        try:
            return self._answer(message)
        except DataPlanError as exc:
            return {"error": str(exc)}
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"data plan: malformed request ({type(exc).__name__}: {exc})"}

    def _answer(self, message: Mapping[str, Any]) -> dict[str, Any]:
        do, number = str(message["do"]), int(message["pass"])
        if number < 1:
            raise DataPlanError(f"data plan: pass {number}: passes count from 1")
        if do == "offer":
            trainers = int(message["trainers"])
            if trainers < 1:
                raise DataPlanError(f"data plan: {trainers} trainers")
            shards = self.passes.get(number)
            if shards is None:
                if self.passes and number < min(self.passes):
                    raise DataPlanError(f"data plan: pass {number} is over")
                before = self.passes.get(max(self.passes)) if self.passes else None
                shards = self.passes[number] = PassShards(number, trainers)
                if before is not None and before.trainers == trainers:
                    # each trainer's pace, whose storage the others read, and the asks honoured go on
                    shards.rates = dict(before.rates)
                    shards.shared_from = list(before.shared_from)
                    shards.asks_honoured = list(before.asks_honoured)
                for old in sorted(self.passes)[:-KEPT_PASSES]:
                    del self.passes[old]
            elif shards.trainers != trainers:
                raise DataPlanError(f"data plan: pass {number} has {shards.trainers} trainers, not {trainers}")
            files = [[str(name), str(path)] for name, path in message["files"]]
            shards.offer(int(message["trainer"]), files, [str(n) for n in message.get("done_before", [])])
            # a pass resumed inside: a checkpoint inside it is named after the one resumed from (K of S grows)
            shards.held_at = max(shards.held_at, int(message.get("held_before", 0)))
            return {"ok": True, "shards": len(shards.order)}
        shards = self.passes.get(number)
        if shards is None:
            raise DataPlanError(f"data plan: pass {number} was not offered")
        now = float(message.get("now", time.time()))
        if do == "take":
            least = int(message.get("least", 0))
            return shards.take(int(message["trainer"]), int(message.get("want", 1)), now, least)
        if do == "finish":
            shards.finish(int(message["trainer"]), [str(n) for n in message["shards"]], now)
            return {"ok": True}
        if do == "give_back":
            shards.give_back(int(message["trainer"]), str(message["shard"]), bool(message.get("unreadable")))
            return {"ok": True}
        if do == "hold":
            refused = shards.hold(str(message["ask"]))
            return {"held": shards.held_at} if refused is None else {"refused": refused}
        if do == "done":
            return {"done": shards.done_names(), "trained_by": dict(shards.trained_by), "shards": len(shards.order)}
        raise DataPlanError(f"data plan: unknown request {do!r}")

    def to_json(self) -> dict[str, Any]:
        return {str(n): vars(p) for n, p in self.passes.items()}

    @staticmethod
    def from_json(value: Mapping[str, Any]) -> DataPlan:
        passes = {}
        for key, fields in value.items():
            record = dict(fields)
            for name in ("offered", "paths"):
                record[name] = {int(k) if name == "offered" else k: v for k, v in record[name].items()}
            record["paths"] = {k: {int(t): p for t, p in v.items()} for k, v in record["paths"].items()}
            record["trained_by"] = dict(record["trained_by"])
            record["rates"] = {int(t): float(r) for t, r in record["rates"].items()}
            passes[int(key)] = PassShards(**record)
        return DataPlan(passes)
