"""Heterogeneous trainers of a split job, whatever the fleet script does with them.

A fleet script written for plain parameter-server jobs has two branches, ``fleet.is_server()`` and
``fleet.is_worker()``; a heterogeneous trainer is neither, so such a script would let it fall through and exit.
So the extension takes heterogeneous trainers over at the end of fleet's ``minimize`` (runtime/patches.py), before
the script's code after it can run: the section's startup, ``init_worker``, then one ``train_from_dataset`` that
serves the pipeline until every previous-stage trainer has stopped, then the process ends (exit 0).  Launched
heterogeneous trainers that the plan does not use (a one-stage plan) leave at ``minimize`` instead, saying why.

CPU trainers' ``stop_worker`` waits until the heterogeneous trainers have finished serving (:func:`wait_for_heter`):
Paddle's launcher stops the whole job as soon as the CPU trainers exit.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, cast

import paddle

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.runtime import auc_states, seam, stage_metrics
from heterps_paddle.runtime.watchdog import reachable, split_endpoints

TAKEOVER_TAG = "heterogeneous trainer taken over"
TAKEOVER_END_TAG = "heterogeneous trainer done"
UNUSED_TAG = "heterogeneous trainer not used by the plan"


def leave_unused(reason: str) -> None:
    """A launched heterogeneous trainer the plan does not use: say why and end the process (exit 0)."""
    ctx = seam.context()
    logger.info("%s: %s (%s); exiting 0", UNUSED_TAG, seam.identity(ctx), reason)
    seam.end_process(0, "")


def worker_dataset(program: Any) -> Any:
    """A one-slot QueueDataset for heterogeneous trainers: they read no data (micro-batches arrive from the
    previous stage), but the pipeline options Paddle sets (``is_fl_mode``) make ``train_from_dataset`` require a
    dataset whose slot description is valid."""
    block = program.global_block()
    name = "heterps_dummy_slot"
    var = block.vars.get(name) or block.create_var(name=name, shape=[-1, 1], dtype="int64", lod_level=1)
    dataset = paddle.distributed.QueueDataset()
    dataset.init(batch_size=1, thread_num=1, use_var=[var], pipe_command="cat")
    dataset.set_filelist([])
    return dataset


def _loss_and_auc(program: Any, loss: str | None) -> tuple[list[Any], list[str]]:
    names = [(loss, "loss")] if loss else []
    # The first accumulating auc op's (paddle.static.auc appends its sliding "batch" op first, then the accumulating
    # one: runtime/auc_states.py); a model with sliding ones only: the first.
    ops = auc_states.auc_ops(program)
    shown = (auc_states.accumulating(ops) or ops)[:1]
    names += [(op.auc, "auc") for op in shown]
    fetch, info = [], []
    for name, label in names:
        for blk in program.blocks:
            if name in blk.vars:
                fetch.append(blk.vars[name])
                info.append(label)
                break
    return fetch, info


def take_over(fleet_obj: Any) -> None:
    """The rest of a heterogeneous trainer's life, from the end of fleet's minimize: never returns."""
    ctx = seam.context()
    program = paddle.static.default_main_program()  # the section (the fixed builder switched the defaults)
    executor = paddle.static.Executor(paddle.CPUPlace())  # the section's heter_place decides where it runs
    executor.run(paddle.static.default_startup_program())
    seam.drop_from_gloo(seam.role_maker())
    fleet_obj.init_worker()
    runtime = seam.fleet_runtime()
    fetch, info = _loss_and_auc(program, ctx.heldout.loss if ctx.heldout else None)
    # what stage 1 CPU trainers fetch and read from their scopes, and the flush their saves ask for
    # (runtime/stage_metrics.py)
    stage_metrics.Service(
        program,
        paddle.static.global_scope(),
        ctx.heldout.loss if ctx.heldout else None,
        runtime,
        last=ctx.stage == ctx.stage_num,
    ).start()
    period = int(cast(int, settings.get("HETERPS_HETER_PRINT_PERIOD")))  # settings.get is typed object
    logger.info(
        "%s (stage %d): serving the pipeline in one train_from_dataset until every CPU trainer calls "
        "stop_worker; the script's own code after minimize does not run here (prints %s every %d batches)",
        TAKEOVER_TAG,
        ctx.stage,
        info,
        period,
    )
    # In Paddle 2.6.2 a heterogeneous trainer's train_from_dataset does not return: after the heter server
    # stops (a stop from each of its fan_in previous-stage trainers, HeterClient::Stop in their stop_worker) its
    # section workers still block in their task queue.  So the end is seen from outside: the listen port closes
    # when the server stops, and a thread ends the process then.
    ender = threading.Thread(
        target=_end_when_served, args=(fleet_obj, runtime, time.time()), name="heterps-takeover-end", daemon=True
    )
    ender.start()
    executor.train_from_dataset(
        program,
        worker_dataset(program),
        fetch_list=fetch or None,
        fetch_info=info or None,
        print_period=period,
        debug=False,
    )
    ender.join()  # (if Paddle returns after all, the ender still does the ending)


def _end_when_served(fleet_obj: Any, runtime: Any, started: float, poll_s: float = 0.2) -> None:
    ctx = seam.context()
    me = f"{os.environ.get('POD_IP', '127.0.0.1')}:{os.environ.get('PADDLE_PORT', '0')}"
    seen_up = False
    while True:
        up = reachable(me, timeout=0.5)
        seen_up = seen_up or up
        if seen_up and not up:
            break
        time.sleep(poll_s)
    if ctx.watchdog is not None:
        ctx.watchdog.armed = False  # the job is ending: servers and CPU trainers go away now, not by failure
    if ctx.dense_refresh is not None:
        ctx.dense_refresh.stop()  # no dense pull racing with the client's shutdown
    logger.info(
        "%s: served %.1f s, until every previous-stage trainer sent its stop (heter server %s closed); stopping",
        TAKEOVER_END_TAG,
        time.time() - started,
        me,
    )
    if ctx.stage < ctx.stage_num:
        fleet_obj.stop_worker()  # a middle stage's stop is what its next stage waits for (its fan_in)
    else:
        # The last stage has no next stage: HeterClient::Stop would send its stop to zero channels and wait
        # forever for the answers (Paddle 2.6.2's SendCmd completes after the last of 0 replies).
        seam.worker_client(runtime).stop_worker()
    logger.info("%s: stop_worker done; exit 0", TAKEOVER_END_TAG)
    # The main thread is blocked in C++ for good; a normal interpreter exit can also crash in the brpc client.
    seam.end_process(0, "")


def wait_for_heter(timeout: float | None = None) -> bool:
    """After a CPU trainer's stop_worker: wait (bounded) until every heterogeneous trainer's endpoint has closed,
    i.e. they have seen every CPU trainer's stop and finished serving.

    Paddle's launcher ends the job (SIGTERM to heterogeneous trainers and servers) as soon as the CPU trainers
    exit, while a heterogeneous trainer notices the last stop only on its listen loop's next poll (1 s), then
    stops its own next stage and ends; killed in between, later stages get no stop."""
    endpoints = split_endpoints(os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"))
    wait = float(cast(float, settings.get("HETERPS_STOP_WAIT_S"))) if timeout is None else timeout
    deadline = time.monotonic() + wait
    still_open = endpoints
    while time.monotonic() < deadline:
        still_open = [ep for ep in endpoints if reachable(ep, timeout=0.5)]
        if not still_open:
            # The port closes when the heter server stops; the process then stops its client and exits.
            time.sleep(float(cast(float, settings.get("HETERPS_STOP_GRACE_S"))))
            return True
        time.sleep(0.2)
    logger.warning(
        "heterogeneous trainers %s still serving %.0f s after this trainer's stop_worker (another CPU "
        "trainer has not stopped?); not waiting longer",
        still_open,
        wait,
    )
    return False
