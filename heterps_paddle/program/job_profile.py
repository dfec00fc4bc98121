"""The profile the automatic path plans from: the program being minimised, measured on this machine as training
runs it, and its digest (what the measurement depends on).

- :func:`program_digest`: the program's ops and variables, without what changes from script to script but not
  the computation (call stacks, name scopes, device tags), so the same model gets the same digest and its
  measurement is reused (measure/cache.py).
- :func:`measure_job`: profiles a copy of the program (the user's is untouched) with local tables, calibrates the
  per-layer times to the C++ trainer loop of ``train_from_dataset``, and adds the parameter servers' CPU per
  sparse row to the local CPU type's sparse layers (measure/ps_service.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import paddle
from paddle.base import core

from heterps_paddle import graph_seam
from heterps_paddle.measure.local_cluster import LOCAL_CPU
from heterps_paddle.measure.ps_service import ProbeFailed, ps_row_cost
from heterps_paddle.planning.model import ModelProfile, model_profile_from_dict, model_profile_to_dict
from heterps_paddle.program import trainer_loop
from heterps_paddle.program.profiler import LayerGroup, profile_program

PROFILE_METHOD = 1  # bump when measure_job measures differently: cached profiles are then measured again
# Attributes that differ between two builds of the same model (where the script lives, name scopes) or that the
# extension itself sets (device tags): not part of what the program computes.
_IGNORED_ATTRS = {"op_callstack", "op_namescope", "op_device", "with_quant_attr", "op_role_var"}


def program_digest(program: Any) -> str:
    """A digest of what ``program`` computes: every op's type, inputs, outputs and attributes, and every
    variable's name, shape, dtype and persistability."""
    h = hashlib.sha256()
    for block in program.blocks:
        for op in block.ops:
            h.update(op.type.encode())
            for slot in sorted(op.input_names):
                h.update(f"<{slot}:{','.join(op.input(slot))}".encode())
            for slot in sorted(op.output_names):
                h.update(f">{slot}:{','.join(op.output(slot))}".encode())
            for name in sorted(set(op.attr_names) - _IGNORED_ATTRS):
                value = op.attr(name)
                if hasattr(value, "idx"):  # a sub-block: its index stands for it
                    value = ("block", value.idx)
                h.update(f"@{name}={value!r}".encode())
        for name in sorted(block.vars):
            var = block.vars[name]
            shape = list(var.shape) if var.type == core.VarDesc.VarType.LOD_TENSOR else []
            h.update(f"${name}:{shape}:{var.dtype}:{var.persistable}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class JobProfile:
    profile: ModelProfile  # times under the cluster's local type names
    measured_step_seconds: float  # the profiler's own check: one batch by Executor.run, measured ...
    predicted_step_seconds: float  # ... and as the sum of its layers
    trainer_seconds: float | None  # per sample, train_from_dataset loop with local tables
    calibration: float | None  # trainer_seconds / the profiler's per-sample sum
    ps_row_seconds: float | None  # parameter servers' CPU per sparse row, added to local_cpu sparse layers
    ps_probe_error: str | None = None  # why the servers' cost could not be measured (then not added)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "profile": model_profile_to_dict(self.profile)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobProfile:
        return cls(**{**data, "profile": model_profile_from_dict(data["profile"], "<cached profile>")})


def random_feed_for(program: Any, batch_size: int, seed: int = 0) -> dict[str, Any]:
    """Plausible inputs for any static program: ids within the vocabulary of the table that reads them
    (Zipf-skewed, as CTR ids are), int64 labels in {0, 1}, floats in [0, 1)."""
    rng = np.random.default_rng(seed)
    block = program.global_block()
    vocab = {}
    for op in block.ops:
        if op.type in ("lookup_table", "lookup_table_v2"):
            for ids in op.input("Ids"):
                vocab[ids] = int(block.var(op.input("W")[0]).shape[0])
    feed: dict[str, Any] = {}
    for var in block.vars.values():
        if not getattr(var, "is_data", False):
            continue
        dims = [batch_size if d is None or d < 0 else d for d in var.shape]
        if var.dtype == paddle.int64:
            if var.name in vocab:
                values = ((rng.zipf(1.1, int(np.prod(dims))) - 1) % vocab[var.name]).astype(np.int64).reshape(dims)
            else:
                values = rng.integers(0, 2, dims).astype(np.int64)
        else:
            values = rng.random(dims).astype("float32")
        if var.lod_level > 0:  # one row per sample, as the example slots are
            feed[var.name] = paddle.base.create_lod_tensor(values, [[1] * batch_size], paddle.CPUPlace())
        else:
            feed[var.name] = values
    return feed


def measure_job(
    loss: Any,
    startup_program: Any,
    optimizer: Any,
    batch_size: int,
    seed: int,
    time_keys: list[str],
    row_cost_types: tuple[str, ...] = (LOCAL_CPU,),
) -> JobProfile:
    """Profile the program being minimised, on this machine's CPU, as training will run it.

    Works on copies: the user's program is untouched.  Tables that live on the parameter servers
    (``sparse_embedding``: SELECTED_ROWS parameters) become local tables in the copy, so the lookups can run here;
    the copy gets the same optimizer as the job, so optimizer ops are timed too.
    """
    # A fresh name generator: names made for the copy (optimizer state, learning rate) must not shift the ones
    # the job's own optimizer gets next (the PS runtime looks them up, e.g. 'learning_rate_0').  The copy's
    # startup draws from the global random generator: give the job back the state it had, so the process that
    # profiled initialises its parameters as it would have without profiling.
    rng_state = paddle.get_rng_state()
    try:
        with paddle.utils.unique_name.guard():
            return _measure_copy(loss, startup_program, optimizer, batch_size, seed, time_keys, row_cost_types)
    finally:
        paddle.set_rng_state(rng_state)


def _local_tables(program: Any) -> list[str]:
    """The parameter servers' tables of ``program`` made local tables; their names."""
    names = []
    for var in program.list_vars():
        if var.persistable and var.type == core.VarDesc.VarType.SELECTED_ROWS:
            shape, dtype = list(var.shape), var.dtype
            var.desc.set_type(core.VarDesc.VarType.LOD_TENSOR)  # forgets shape and dtype: restore them
            var.desc.set_shape(shape)
            var.desc.set_dtype(dtype)
            names.append(var.name)
    return names


def _drop_table_updates(program: Any, tables: list[str]) -> int:
    """Remove the optimizer ops that update ``tables`` (every op with a ``Param`` input among them); how many.

    In the job the servers update a table, per row a batch touched (add_ps_service_time counts that); trainers never
    run these ops.  The copy's local ones cost what the whole table costs: its Adam on a 1,000,001 x 9 table took
    86 of the 92 ms of a batch of 128 (lazy_mode or not: the sum of the lookups' sparse gradients is dense), and the
    profiler put that time on the last fc layer, where the serial executor ran it."""
    block = program.global_block()
    doomed = [
        index
        for index, op in enumerate(block.ops)
        if "Param" in op.input_names and any(name in tables for name in op.input("Param"))
    ]
    for index in reversed(doomed):
        graph_seam.remove_op(block, index, sync=False)
    if doomed:
        graph_seam.sync_with_cpp(program)
    return len(doomed)


def _measure_copy(
    loss: Any,
    startup_program: Any,
    optimizer: Any,
    batch_size: int,
    seed: int,
    time_keys: list[str],
    row_cost_types: tuple[str, ...],
) -> JobProfile:
    main = loss.block.program.clone()
    startup = startup_program.clone()
    tables = _local_tables(main)
    _local_tables(startup)
    copy_loss = main.global_block().var(loss.name)
    with paddle.static.program_guard(main, startup):
        type(optimizer)(learning_rate=graph_seam.learning_rate(optimizer)).minimize(copy_loss)
    _drop_table_updates(main, tables)  # the servers' work, not the trainers'
    feed = random_feed_for(main, batch_size, seed)
    # Times are measured only for the cluster's local types; without one every time is an estimate, and only
    # the sizes (FLOPs, bytes) are needed.
    report = profile_program(
        main,
        startup,
        feed,
        batch_size,
        fetch_list=[copy_loss],
        name="program",
        time_key=time_keys[0] if time_keys else None,
        measure=bool(time_keys),
    )
    profile = report.profile
    calibration = trainer_seconds = None
    if time_keys:
        # The profiler times ops under Executor.run; training runs them in the C++ trainer loop of
        # train_from_dataset, which has far less per-step overhead.  Keep the profiler's split over layers and
        # scale it to the trainer loop's measured time per sample.
        trainer_seconds = trainer_loop.seconds_per_sample(main, startup, feed, batch_size)
        profiled = sum(layer.time[time_keys[0]] for layer in profile.layers)
        calibration = trainer_seconds / profiled if profiled > 0 else 1.0
        profile = replace(
            profile,
            layers=tuple(
                replace(layer, time={key: layer.time[time_keys[0]] * calibration for key in time_keys})
                for layer in profile.layers
            ),
        )
    ps_row_seconds = probe_error = None
    priced_rows = tuple(key for key in time_keys if key in row_cost_types)
    if priced_rows:
        try:
            profile, ps_row_seconds = add_ps_service_time(profile, sparse_rows_per_sample(report.layers), priced_rows)
        except ProbeFailed as exc:
            # Training can go on: the plan is made without the servers' share and the report says so.
            probe_error = str(exc)
    return JobProfile(
        profile,
        report.measured_step_seconds,
        report.predicted_step_seconds,
        trainer_seconds,
        calibration,
        ps_row_seconds,
        probe_error,
    )


def sparse_rows_per_sample(layers: list[LayerGroup]) -> dict[str, float]:
    """Sparse layer name -> table rows it looks up per sample (what the servers pull and push), from the grouping
    the profiler made of the same program with the same feed."""
    return {layer.name: layer.rows_per_sample for layer in layers if layer.kind == "sparse"}


def add_ps_service_time(
    profile: ModelProfile, rows: dict[str, float], keys: tuple[str, ...] = (LOCAL_CPU,)
) -> tuple[ModelProfile, float]:
    """The CPU types' (``keys``: the local one, or a host's type measured on it) sparse-layer times with the
    parameter servers' work added.

    The profile ran with local tables.  On a CPU stage the rows are pulled from and pushed to the servers, which
    on this machine share the trainers' cores: each looked-up row costs the CPU time the ps_service probe measured
    (trainer and server side together), once per sample.  The local GPU type keeps the local-table time: a GPU
    stage's embeddings live in the project's table, synchronised with the servers once per pass, not per sample.
    """
    row_seconds = ps_row_cost().row_seconds
    layers = []
    for layer in profile.layers:
        if layer.name in rows:
            extra = rows[layer.name] * row_seconds
            layer = replace(layer, time={**layer.time, **{k: layer.time[k] + extra for k in keys if k in layer.time}})
        layers.append(layer)
    return replace(profile, layers=tuple(layers)), row_seconds
