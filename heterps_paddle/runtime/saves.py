"""Saves a fleet script makes in a split job write the trained model (docs/sections.md, "Saves and metrics").

On a stage 1 CPU trainer of a split plan the default main program is stage 1's section and the global scope
holds stage 1's variables: the dense parameters of the later stages were never pulled there (Paddle pulls, before
a save, only the tables of the program it saves, and the section has none), so Paddle's own save functions wrote
the startup values of every later-stage parameter, or a stage 1 fragment of the model.  Each save is therefore
prepared here before Paddle's code runs, so that it writes what the servers hold, in the files and layout a
one-stage job writes:

- the whole model's persistable dense variables are made in the global scope (from the whole model's startup,
  runtime/heldout.py) and every dense table is pulled from the servers into them;
- a program argument that is the section (or none) becomes the whole model, the PS runtime's origin program (what
  a one-stage job's runtime saves);
- Paddle's static-graph savers (``paddle.static.save_inference_model`` / ``save``) cannot write a program with
  parameter-server tables at all, one-stage or split (a crash after writing the ``.pdmodel``, or an error): they are
  refused before anything is written, naming the tables and the fleet saves that work;
- saves that run on the servers (``fleet.save_persistables``, ``save_cache_model``, ``save_one_table``) already
  write every table; the trainer's own pending requests are flushed first.

A heterogeneous trainer never runs the script's code after ``minimize`` (runtime/heter.py), and it holds one
section only: a save there is refused, naming where to save instead.
"""

from __future__ import annotations

import os
from typing import Any

import paddle
from paddle.base import core

from heterps_paddle.errors import HeterPSError
from heterps_paddle.log import logger
from heterps_paddle.runtime import checkpoint, push_queues, seam, stage_metrics, table_shards
from heterps_paddle.runtime.checkpoint_choice import STAGING
from heterps_paddle.runtime.heldout import HeldOut, whole_forward_program, whole_model_from_servers

# Fleet's save entry points (TheOnePSRuntime methods) and what each writes.
SERVER_SIDE_SAVES = ("_save_persistables", "_save_cache_model", "_save_one_table", "_save_cache_table")
TRAINER_SIDE_SAVES = ("_save_inference_model", "_save_dense_params")
FLEET_SAVES = SERVER_SIDE_SAVES + TRAINER_SIDE_SAVES


class SaveNotPossibleHere(HeterPSError, RuntimeError):
    """A save called by a process of a split job that does not hold the model it would write."""


def refuse_on_heter(what: str) -> None:
    ctx = seam.context()
    if ctx.role == "heter":
        raise SaveNotPossibleHere(
            f"{what} on {seam.identity(ctx)}: a heterogeneous trainer of a split plan holds stage {ctx.stage}'s "
            "section only; save on the stage 1 CPU trainers (fleet.is_first_worker()), which write the whole "
            "model from the servers"
        )


def _held(what: str) -> HeldOut:
    held: HeldOut | None = seam.context().heldout
    if held is None:
        raise SaveNotPossibleHere(
            f"{what} on {seam.identity()}: this process has no copy of the whole model (the split plan was applied "
            "without it); nothing was written"
        )
    return held


def _is_section(program: Any) -> bool:
    return program is None or seam.is_heter_section(program)


def whole_model_into_scope(executor: Any, program: Any, scope: Any = None, what: str = "save") -> list[str]:
    """Make ``program``'s persistable dense vars in ``scope`` (the global scope by default) and pull every dense
    table from the servers into it; returns the pulled names."""
    held = _held(what)
    scope = paddle.static.global_scope() if scope is None else scope
    runtime = seam.fleet_runtime()
    made, pulled = whole_model_from_servers(
        held, executor or paddle.static.Executor(paddle.CPUPlace()), program, scope, runtime
    )
    logger.info(
        "%s of a split job: the whole model from the servers (%d vars made here, %d dense vars pulled)",
        what,
        len(made),
        len(pulled),
    )
    later_stages_statistics(program if program is not None else held.forward, scope, what)
    return pulled


def later_stages_statistics(program: Any, scope: Any, what: str) -> None:
    """The running statistics (batch norms' moving mean and variance) of ``program``'s later stages, into ``scope``
    from the heterogeneous trainers that hold them: they are no parameters, so the servers never had them, and the
    whole model's startup left them at 0 and 1 here (DLRM's top MLP saved so scored 0.57 against one stage's 0.63)."""
    # this stage's own are in the scope, trained here (the default main program is stage 1's section)
    mine = set(stage_metrics.running_statistics(paddle.static.default_main_program()))
    wanted = [name for name in stage_metrics.running_statistics(program) if name not in mine]
    if not wanted:
        return
    found = stage_metrics.client()
    try:
        held = found.running_statistics() if found is not None else {}
    except OSError as exc:
        held = {}
        logger.warning("%s: the heterogeneous trainers' running statistics could not be read (%s)", what, exc)
    block = program.global_block()
    for name in wanted:
        if name in held:
            shape = [d for d in block.var(name).shape] if block.has_var(name) else list(held[name].shape)
            scope.var(name).get_tensor().set(held[name].reshape(shape), paddle.CPUPlace())
    missing = [name for name in wanted if name not in held]
    if missing:
        logger.warning(
            "%s: %d running statistics of a later stage are saved at their startup values (no heterogeneous "
            "trainer sent them): %s",
            what,
            len(missing),
            ", ".join(missing),
        )
    else:
        logger.info("%s: %d running statistics of later stages from their heterogeneous trainers", what, len(wanted))


def _vars_by_name(program: Any, variables: Any) -> list[Any]:
    """``variables`` (Variables of the user's program, or names) as variables of ``program``."""
    block = program.global_block()
    items = variables if isinstance(variables, (list, tuple)) else [variables]
    return [block.var(v if isinstance(v, str) else v.name) for v in items]


def before_fleet_save(name: str, runtime: Any, arguments: dict[str, Any]) -> None:
    """Before ``TheOnePSRuntime.<name>`` (a fleet save) runs in this process, with its arguments by name (which
    this may replace)."""
    refuse_on_heter(f"fleet {name.lstrip('_')}")
    if not seam.context().split or seam.context().role != "trainer":
        return
    if name in SERVER_SIDE_SAVES:
        push_queues.flush_pushes(runtime, f"before fleet {name.lstrip('_')}")
        stage_metrics.flush_heterogeneous_trainers()
        return
    origin = seam.origin_program(runtime)
    executor = arguments.get("executor")
    if name == "_save_inference_model":
        main_program = arguments.get("main_program")
        if _is_section(main_program) or main_program is origin:
            arguments["main_program"] = None  # the runtime's origin program: the whole model
        if "target_vars" in arguments:
            arguments["target_vars"] = _vars_by_name(origin, arguments["target_vars"])
        whole_model_into_scope(executor, origin, what="fleet save_inference_model")
    elif name == "_save_dense_params":
        whole_model_into_scope(executor, origin, what="fleet save_dense_params")


def after_fleet_save(name: str, runtime: Any, arguments: dict[str, Any]) -> None:
    """After a fleet save returned (every trainer passed its closing barrier)."""
    if not seam.is_first_worker(runtime.role_maker):
        return
    if name == "_save_inference_model":
        # the shard count its sparse tables were saved in, beside them: what a plain Paddle job must set to load it
        table_shards.write_layout(os.path.normpath(arguments["dirname"]), seam.sparse_table_layout(runtime))
    if name != "_save_persistables":
        return
    dirname = os.path.normpath(arguments["dirname"])
    mode = int(arguments.get("mode") or 0)
    if seam.context().deferred_save == dirname:
        return  # the launch's two-phase checkpoint finishes it in the background (runtime/launch_checkpoints.py)
    # a full save (mode 0), or the launch's own base or increment (modes 2 and 1: runtime/launch_checkpoints.py)
    if not mode or (mode in (1, 2) and STAGING.fullmatch(os.path.basename(dirname))):
        checkpoint.after_save_persistables(runtime, dirname, mode)


def _refuse_server_tables(what: str, program: Any) -> None:
    """Paddle 2.6.2 cannot save a parameter-server program with its static-graph savers, one-stage or split: the
    sparse table is a SELECTED_ROWS variable on the trainer, ``save_inference_model`` crashes in ``save_combine``
    after writing the ``.pdmodel``, ``save`` raises on it.  Refused before anything is written, saying what works."""
    tables = sorted(
        name
        for blk in program.blocks
        for name, var in blk.vars.items()
        if var.persistable and var.type == core.VarDesc.VarType.SELECTED_ROWS
    )
    if tables:
        raise SaveNotPossibleHere(
            f"{what}: {', '.join(tables)} live on the parameter servers (sparse tables), which Paddle 2.6.2's "
            "static-graph savers cannot write (the same in a plain parameter-server job: save_inference_model "
            "crashes after writing the .pdmodel, save raises); nothing was written.  Use "
            "fleet.save_inference_model(exe, dirname, feed_names, targets) for the model and "
            "fleet.save_persistables(exe, dirname) for a checkpoint: both write every table"
        )


def static_save_inference_model(
    original: Any, path_prefix: Any, feed_vars: Any, fetch_vars: Any, executor: Any, **kwargs: Any
) -> Any:
    """``paddle.static.save_inference_model`` under heterps: refused on heterogeneous trainers and for programs
    with parameter-server tables (:func:`_refuse_server_tables`); others go to Paddle unchanged."""
    what = "paddle.static.save_inference_model"
    refuse_on_heter(what)
    ctx = seam.context()
    program = kwargs.get("program") or paddle.static.default_main_program()
    if ctx.split and ctx.role == "trainer" and _is_section(kwargs.get("program")):
        program = whole_forward_program(_held(what))
    _refuse_server_tables(what, program)
    return original(path_prefix, feed_vars, fetch_vars, executor, **kwargs)


def static_save(original: Any, program: Any, model_path: Any, *args: Any, **kwargs: Any) -> Any:
    """``paddle.static.save`` under heterps: the same rules."""
    what = "paddle.static.save"
    refuse_on_heter(what)
    ctx = seam.context()
    whole = program if program is not None else paddle.static.default_main_program()
    if ctx.split and ctx.role == "trainer" and _is_section(program):
        whole = seam.origin_program(seam.fleet_runtime())
    _refuse_server_tables(what, whole)
    return original(program, model_path, *args, **kwargs)
