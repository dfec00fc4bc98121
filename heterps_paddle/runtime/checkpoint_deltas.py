"""The sparse tables' settings an incremental checkpoint relies on (docs/checkpoints.md, "Incremental checkpoints").

An incremental checkpoint is Paddle's "xbox delta" save (``save_persistables`` mode 1): on each server it writes the
rows whose ``delta_score`` reached the accessor's ``delta_threshold``.  Every push adds
``(show - click) * nonclk_coeff + click * click_coeff`` to a row's score (a push shows at least 1: Paddle's fused
push and the GPU stage's push feed show = 1), and mode 1 and the full base (mode 2) reset the written rows' scores.
With ``delta_threshold`` a small epsilon every row pushed since the last save is written and no other one
(docs/paddle-notes.md, "Incremental saves").  Paddle's default (0) writes every row, so the launch sets the epsilon
on every sparse table, on every process, after ``minimize`` (before the servers and clients build their table
protos), and refuses the settings with which a delta would miss a pushed row, naming the key.

Imports no Paddle at import time (launch_checkpoints imports it): Paddle inside the functions.
"""

from __future__ import annotations

from typing import Any, Iterable

from heterps_paddle.log import logger
from heterps_paddle.runtime import seam
from heterps_paddle.runtime.checkpoint_files import CheckpointError

DELTA_THRESHOLD = 1e-6  # below any push's score: 0.1 (Paddle's nonclk_coeff) per shown, unclicked id
MIN_COEFFICIENT = 1e-5  # nonclk_coeff / click_coeff below this could score a push under DELTA_THRESHOLD
SHOW_CLICK_ENTRY = "show_click_entry"
KEY = "strategy.sparse_table_configs[{table}].accessor.ctr_accessor_param.{field}"


def sparse_table_names(runtime: Any) -> list[str]:
    """The sparse tables (their parameters' names) of the PS runtime's programs, as ``init_server`` lists them."""
    from paddle.distributed.ps.utils.public import get_sparse_tablenames  # lazy (module doc)

    programs = runtime.origin_main_programs
    return sorted(set(get_sparse_tablenames(programs, True)) | set(get_sparse_tablenames(programs, False)))


def show_click_entries(programs: Iterable[Any], names: Iterable[str]) -> list[str]:
    """The tables among ``names`` looked up with a ShowClickEntry (the model's own show and click are pushed: a
    push of show = click = 0 would score 0 and be missed by a delta)."""
    wanted = set(names)
    found: set[str] = set()
    for program in programs:
        for block in program.blocks:
            for op in block.ops:
                if not op.has_attr("entry") or "W" not in op.input_names:
                    continue
                entry = str(op.attr("entry"))
                found.update(name for name in op.input("W") if name in wanted and entry.startswith(SHOW_CLICK_ENTRY))
    return sorted(found)


def refusal(table: str, field: str, value: float, why: str) -> CheckpointError:
    return CheckpointError(
        f"incremental checkpoints (HETERPS_CHECKPOINT_BASE_EVERY > 1): {KEY.format(table=table, field=field)} = "
        f"{value:g} {why}; unset it, or keep full checkpoints only (HETERPS_CHECKPOINT_BASE_EVERY=1)"
    )


def base_threshold(param: Any) -> float:
    """A table's ``ctr_accessor_param.base_threshold`` as Paddle applies it: 0 when unset (the_one_ps's default).
    Over 0, Paddle's base and delta saves (modes 2 and 1) leave out the rows scoring under it."""
    return float(param.base_threshold) if param.HasField("base_threshold") else 0.0


def set_delta_threshold(tables: Any, names: Iterable[str]) -> None:
    """In ``tables`` (a strategy's ``sparse_table_configs``, edited in place): ``delta_threshold`` = the epsilon on
    every table of ``names``; a setting that would leave pushed rows out of a delta is an error naming it."""
    for name in names:
        param = seam.sparse_table_config(tables, name).accessor.ctr_accessor_param
        if base_threshold(param) > 0:
            raise refusal(name, "base_threshold", param.base_threshold, "leaves rows scoring under it out of a save")
        for field in ("nonclk_coeff", "click_coeff"):
            if param.HasField(field) and getattr(param, field) < MIN_COEFFICIENT:
                raise refusal(
                    name, field, getattr(param, field), f"scores a push under the delta threshold {DELTA_THRESHOLD:g}"
                )
        if param.HasField("delta_threshold") and param.delta_threshold > DELTA_THRESHOLD:
            raise refusal(
                name, "delta_threshold", param.delta_threshold, "leaves rows pushed less than that out of a delta"
            )
        if not param.HasField("delta_threshold") or param.delta_threshold <= 0:
            param.delta_threshold = DELTA_THRESHOLD


def configure(fleet: Any) -> None:
    """After ``minimize`` on every process (servers and trainers) of a launch keeping incremental checkpoints."""
    runtime = seam.fleet_runtime()
    names = sparse_table_names(runtime)
    entries = show_click_entries(runtime.origin_main_programs, names)
    if entries:
        raise CheckpointError(
            f"incremental checkpoints (HETERPS_CHECKPOINT_BASE_EVERY > 1): the sparse tables {', '.join(entries)} are "
            "looked up with a ShowClickEntry (the model's own show and click are pushed: an id pushed with show 0 "
            "would be left out of a delta); keep full checkpoints only (HETERPS_CHECKPOINT_BASE_EVERY=1)"
        )
    for strategy in seam.job_strategies(runtime):
        set_delta_threshold(strategy.sparse_table_configs, names)
    logger.info(
        "incremental checkpoints: delta_threshold %g on the sparse tables %s (a delta writes the rows pushed since "
        "the previous checkpoint)",
        DELTA_THRESHOLD,
        names,
    )
