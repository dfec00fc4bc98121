"""A plan applied to this process, before Paddle's PS optimizer builds its programs (docs/sections.md).

- One stage: the program goes to the PS optimizer unsplit.  If heterogeneous trainers were launched anyway,
  servers and CPU trainers build the plain job (runtime/seam.leave_heter_mode) and the heterogeneous trainers
  leave (runtime/heter.leave_unused).
- Split: every forward op is tagged with its stage (program/partition.py) so the fixed heter builder cuts the
  program into sections; the whole forward pass is stashed for held-out evaluation (runtime/heldout.py); a
  watchdog probes the peers (runtime/watchdog.py); and hooks go in around ``train_from_dataset`` (fetches of
  later stages dropped, dense parameters refreshed), after fleet's minimize (heterogeneous trainers taken over,
  the section keeps ``_fleet_opt``) and after ``stop_worker`` (CPU trainers wait for the pipeline to drain).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, cast

import paddle

from heterps_paddle import settings
from heterps_paddle.log import logger
from heterps_paddle.planning.model import Plan
from heterps_paddle.program.partition import tag_program
from heterps_paddle.program.profiler import LayerGroup
from heterps_paddle.runtime import heldout, heter, meter, patches, seam, stage_metrics
from heterps_paddle.runtime.dense_refresh import DenseRefresher
from heterps_paddle.runtime.watchdog import Watchdog, peer_endpoints

# Communicator settings under which routing dense grads through Communicator::Send (fix 5, "communicator" mode)
# ran near the speed of plain async PS; defaults made it ~7x slower. Only defaults: a user's FLAGS_* win.
COMMUNICATOR_ENV_DEFAULTS = {
    "FLAGS_communicator_send_queue_size": "16",
    "FLAGS_communicator_max_merge_var_num": "16",
    "FLAGS_communicator_send_wait_times": "1",
    "FLAGS_communicator_thread_pool_size": "8",
}


def heter_launched() -> bool:
    return bool(os.environ.get("PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST"))


def apply_plan(
    loss: Any, plan: Plan, startup_program: Any = None, layers: list[LayerGroup] | None = None
) -> dict[str, int] | None:
    """Make this process run its part of ``plan``; returns layer -> stage for a split plan.  ``layers``: the
    program's, checked against the plan, when minimize has them (program/partition.py ``planned_layers``)."""
    ctx = patches.install()
    ctx.plan = plan
    if plan.num_stages == 1:
        if heter_launched():
            if ctx.role == "heter":
                heter.leave_unused(
                    f"the plan runs in one stage on the {plan.stages[0].units} CPU trainers ({plan.stages[0].resource})"
                )
            seam.leave_heter_mode(seam.role_maker())
        logger.info("plan has one stage: the program goes to Paddle's PS optimizer unsplit")
        return None
    program = loss.block.program
    ctx.heldout = heldout.stash(program, startup_program or paddle.static.default_startup_program(), loss)
    layer_stage = tag_program(program, plan, layers)
    for key, value in COMMUNICATOR_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)  # read by TrainerRuntimeConfig inside the PS optimizer's minimize
    if ctx.role in ("trainer", "heter") and settings.get("HETERPS_WATCHDOG"):
        peers = peer_endpoints()
        ctx.watchdog = Watchdog(
            peers, seam.identity(ctx), startup_timeout=float(cast(float, settings.get("HETERPS_STARTUP_TIMEOUT")))
        ).start()
        logger.info("watchdog: %s watches %d peers", seam.identity(ctx), len(peers))
    ctx.dataset_hooks["heldout"] = heldout.redirect_hook
    ctx.run_redirect = heldout.run_redirect
    ctx.dataset_hooks["section"] = section_hook
    if ctx.role == "heter":
        ctx.after_minimize["takeover"] = heter.take_over
    elif ctx.role == "trainer":
        ctx.after_minimize["fleet_opt"] = keep_fleet_opt
        ctx.after_stop_worker["wait_heter"] = heter.wait_for_heter
    logger.info("plan has %d stages; layers -> stage %s", plan.num_stages, layer_stage)
    return layer_stage


def keep_fleet_opt(fleet_obj: Any) -> None:
    """Give the section program the ``_fleet_opt`` fleet gives a plain PS program (it skips heter jobs): fleet
    scripts read and write it (``_fleet_opt['stat_var_names']``); a heter pipeline's trainer ignores it."""
    program = paddle.static.default_main_program()
    options = seam.fleet_opt(program)
    if options is None:
        options = {}
    options["mpi_size"] = fleet_obj.worker_num()
    options["mpi_rank"] = fleet_obj.worker_index()
    for key, value in seam.user_strategy(fleet_obj).trainer_desc_configs.items():
        if value or key not in options:
            options[key] = value
    seam.set_fleet_opt(program, options)


@contextlib.contextmanager
def section_hook(call: seam.DatasetCall) -> Iterator[None]:
    """Around a section's ``train_from_dataset``: later stages' fetches dropped (CPU trainers), dense parameters
    refreshed from the servers (fix 5, ``pull`` mode), the watchdog armed while this process trains."""
    program = call.main_program()
    if not seam.is_heter_section(program):
        yield
        return
    ctx = seam.context()
    metrics = None
    if ctx.role == "trainer" and ctx.heldout is not None:
        metrics = _pass_metrics(ctx, call, program)
        call.options["fetch_list"], call.options["fetch_info"] = heldout.section_fetch(
            ctx.heldout, program, call.options.get("fetch_list"), call.options.get("fetch_info")
        )
    if ctx.first_send is not None:
        ctx.first_send.reset()  # a CPU trainer's server starts again at every pass (runtime/first_send.py)
    if ctx.watchdog is not None:
        ctx.watchdog.armed = True
        ctx.watchdog.expect_own_listen()
    refresher = None
    if settings.get("HETERPS_DENSE_REFRESH") == "pull":
        refresher = DenseRefresher(seam.fleet_runtime(), program).start()
        ctx.dense_refresh = refresher
    try:
        yield
        if metrics is not None:
            metrics.finish()
    finally:
        if metrics is not None:
            metrics.stop.set()
        if refresher is not None:
            refresher.stop()
            ctx.dense_refresh = None
        if ctx.watchdog is not None:
            ctx.watchdog.own_listen_done()  # its server stops with the pass
        if ctx.watchdog is not None and ctx.role == "trainer":
            # Its own training is over: its peers go away because the job is ending, not because one failed.
            ctx.watchdog.armed = False


def _pass_metrics(ctx: seam.ProcessContext, call: seam.DatasetCall, program: Any) -> stage_metrics.PassMetrics | None:
    """The last stage's loss and AUC for this pass's prints, fetch handler and scope (runtime/stage_metrics.py)."""
    client = stage_metrics.client()
    if client is None:
        return None
    names = {n for blk in program.blocks for n in blk.vars}
    fetch_list = call.options.get("fetch_list") or []
    infos = call.options.get("fetch_info") or []
    elsewhere = []
    for i, var in enumerate(fetch_list):
        name = var if isinstance(var, str) else var.name
        if name not in names:
            elsewhere.append((name, infos[i] if i < len(infos) else name))
    handler = call.options.pop("fetch_handler", None)  # Paddle's monitor would read this section's scope
    metrics = stage_metrics.PassMetrics(
        client=client,
        scope=call.scope if call.scope is not None else paddle.static.global_scope(),
        fetch=elsewhere,
        print_period=int(call.options.get("print_period") or 100),
        batch_size=stage_metrics.dataset_batch_size(call.dataset),
        handler=handler,
        expected=meter.dataset_samples(call.dataset),
    )
    try:
        return metrics.start()
    except OSError as exc:
        logger.warning("the last stage's metrics could not be read (%s): not carried into this pass", exc)
        return None
