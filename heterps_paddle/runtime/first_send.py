"""A stage's first send of a pass, held until the stages it talks to can take it (docs/paddle-notes.md).

Paddle 2.6.2 starts a stage's ``HeterServer`` in a thread that registers the server's message handlers only after
the server takes requests (``HeterListenAndServOp::RunImpl``: ``WaitServerReady``, then ``RunAsyncLoop``), while the
trainer's own threads start sending as soon as the server is ready (``HeterPipelineTrainer::Run``).  A message that
arrives in between aborts the process that receives it (``illegal message_name ... not in handler_map_``); one
suite run in about a dozen saw a CPU trainer abort so, at its first backward.  Nothing outside Paddle's C++ can
see the handlers.  So a ``py_func`` op at the head of the section's forward ops holds the first micro-batch of each
pass until this process's own server listens and every next-stage endpoint answers, and then ``HOLD_S`` longer:
the registering thread is runnable from the moment its server is ready, and a runnable thread waits far less than
a second for a core, even at a load average of 75 on two cores.  It costs ``HOLD_S`` once per pass.

A CPU trainer's server starts again at every pass (``HeterPipelineTrainer::Finalize`` stops it), so its hold is
reset at every pass (runtime/sections.py); a heterogeneous trainer serves the whole job in one pass.  The own
endpoint is also the watchdog's to check (runtime/watchdog.py): a port that another process took before this one
bound it leaves ``HeterPipelineTrainer::Run`` waiting forever, before any op runs.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from paddle.static.nn.common import PyFuncRegistry

from heterps_paddle.graph_seam import insert_op
from heterps_paddle.log import logger
from heterps_paddle.runtime.seam import PaddleBehaviourChanged, ProcessContext
from heterps_paddle.runtime.watchdog import listens_here, reachable

HOLD_S = 1.0
POLL_S = 0.1
HOLD_VAR = "heterps_first_send_hold"


@dataclass(frozen=True)
class SectionEndpoints:
    """Where this stage's server listens, and the next stage's servers its forward send goes to."""

    own: str | None
    next_stage: tuple[str, ...]
    forward_block: int | None  # the block of the forward send (None: the last stage sends no forward)


def section_endpoints(section: Any) -> SectionEndpoints:
    own: str | None = None
    next_stage: tuple[str, ...] = ()
    forward_block: int | None = None
    for block in section.blocks:
        for op in block.ops:
            if op.type == "heter_listen_and_serv" and own is None:
                own = str(op.attr("endpoint"))
            elif op.type == "send_and_recv" and op.attr("mode") == "forward":
                next_stage = tuple(str(e) for e in op.attr("next_endpoints"))
                forward_block = block.idx
    return SectionEndpoints(own, next_stage, forward_block)


class FirstSendHold:
    """Run by the ``py_func`` op in every forward thread of the section; only the first call of a pass waits."""

    def __init__(self, own: str, next_stage: tuple[str, ...], pid: int, timeout_s: float):
        self.own = own
        self.next_stage = next_stage
        self.pid = pid
        self.timeout_s = timeout_s
        self.passes_held = 0
        self._lock = threading.Lock()
        self._released = threading.Event()

    def reset(self) -> None:
        """A new pass: its first send waits again."""
        self._released.clear()

    def ready(self) -> bool:
        return listens_here(self.own, self.pid) and all(reachable(e, timeout=POLL_S) for e in self.next_stage)

    def __call__(self) -> None:
        if self._released.is_set():
            return
        with self._lock:
            if not self._released.is_set():
                waited = self._wait()
                if self.passes_held == 0:  # one line per process: later passes hold the same way
                    logger.info(
                        "first send held %.1f s, until %s listened and %s answered (runtime/first_send.py)",
                        waited,
                        self.own,
                        ", ".join(self.next_stage),
                    )
                self.passes_held += 1
                self._released.set()

    def _wait(self) -> float:
        """Seconds held."""
        started = time.monotonic()
        deadline = started + self.timeout_s
        ready_since = None
        while True:
            now = time.monotonic()
            if self.ready():
                ready_since = now if ready_since is None else ready_since
                if now - ready_since >= HOLD_S:
                    return now - started
            else:
                ready_since = None
            if now > deadline:
                # The watchdog names what never came up and ends the process; holding longer would help nothing.
                return now - started
            time.sleep(POLL_S)


def install(section: Any, ctx: ProcessContext, timeout_s: float) -> None:
    """The hold at the head of ``section``'s forward ops (a stage that sends forward), and the section's own
    endpoint for the watchdog to check."""
    endpoints = section_endpoints(section)
    if ctx.watchdog is not None:
        ctx.watchdog.own_endpoint = endpoints.own
    if endpoints.forward_block is None:
        return
    if endpoints.own is None:
        raise PaddleBehaviourChanged("heterps: a section with a forward send has no heter_listen_and_serv op")
    hold = FirstSendHold(endpoints.own, endpoints.next_stage, os.getpid(), timeout_s)

    def hold_first_send() -> None:
        hold()

    block = section.block(endpoints.forward_block)
    # py_func needs an input or an output; this one is never written, so the op skips it at run time.
    block.create_var(name=HOLD_VAR, shape=[1], dtype="float32", persistable=False)
    insert_op(
        block,
        0,
        type="py_func",
        inputs={"X": [block.var(HOLD_VAR)]},
        outputs={"Out": []},
        attrs={
            "forward_callable_id": PyFuncRegistry(hold_first_send).id,
            "backward_callable_id": -1,
            "backward_skip_vars": [],
        },
    )
    ctx.first_send = hold
