"""The job's data plan: each training pass's shards, handed to the stage 1 CPU trainers as they are ready for one.

A trainer does not train a share fixed by its script: it offers the files its script gave it, the pass is the
multiset of every trainer's offers (a file N trainers were given is N shards, trained N times, as plain Paddle
would), and each trainer takes its next shards when it has trained the last, so a fast trainer trains more and a
slow one less, with no barrier between shards (DLRover's job master hands out its data shards the same way: todo,
doing, done).  A file is named by its content (names.py: base name, bytes, a digest of sampled blocks), so the
same file under two paths (two hosts' mounts) is the same shard for a resume and for who may read it.

:class:`DataPlan` (plan.py) is the whole state, pure and JSON-shaped: the launch's coordinator holds one per round
and answers the trainers' requests with it (launch/board.py), a launch on one host keeps it in a file under a lock
(rendezvous.FileBoard).  One pass's rules are :class:`PassShards`' (shards.py); every request's bounds are
bounds.py's.  docs/data-plan.md describes them.

Pure Python, no Paddle: the coordinator imports it.
"""

from heterps_paddle.data_plan.bounds import DataPlanError
from heterps_paddle.data_plan.names import ContentName, is_content_name, parse, size_of
from heterps_paddle.data_plan.plan import KEPT_PASSES, DataPlan
from heterps_paddle.data_plan.shards import CALL_S, Paces, PassShards

__all__ = [
    "CALL_S",
    "KEPT_PASSES",
    "ContentName",
    "DataPlan",
    "DataPlanError",
    "Paces",
    "PassShards",
    "is_content_name",
    "parse",
    "size_of",
]
