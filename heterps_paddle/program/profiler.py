"""Static Program -> ModelProfile: ops grouped into layers, sizes from var shapes, per-layer time measured with
``paddle.profiler`` on the local CPU.

Grouping (forward ops in program order): a lookup starts a sparse layer and later lookups of the same table join
it (26 slots sharing one table are one layer, not 26 copies of the table); a matmul against a parameter starts a
dense layer; every other op (pooling, bias add, activation, concat, loss) joins the current layer, so loss ops
join the last one. Backward and optimizer ops go to the layer whose variable or parameter they update.

It imports Paddle: the ``heterps`` commands that use it (profile, bench scheduler) import this module lazily.
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle
import paddle.profiler as profiler

from heterps_paddle.planning.model import LayerProfile, ModelProfile

LOOKUP_OPS = {"lookup_table", "lookup_table_v2"}
MATMUL_OPS = {"mul", "matmul", "matmul_v2"}
FORWARD, BACKWARD, OPTIMIZE, LOSS = 0, 1, 2, 256
# Bytes of optimizer state per parameter byte, parameter included (Adam keeps two moments).
OPTIMIZER_STATE = {"adam": 3, "adamw": 3, "lamb": 3, "momentum": 2, "adagrad": 2, "rmsprop": 3, "sgd": 1}
DEFAULT_STATE = 3  # no optimizer in the program yet: assume Adam, what the example models train with
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4}


@dataclass
class LayerGroup:
    name: str
    kind: str
    table: str | None = None  # sparse: the embedding parameter
    op_indices: list[int] = field(default_factory=list)  # forward ops (block order)
    params: list[str] = field(default_factory=list)
    flops: float = 0.0
    io_bytes: float = 0.0
    rows_per_sample: float = 0.0  # sparse: table rows looked up per sample (what a parameter server serves)


@dataclass(frozen=True)
class ProfileReport:
    profile: ModelProfile
    measured_step_seconds: float  # median wall time of exe.run without the profiler
    predicted_step_seconds: float  # sum of per-layer times (profiled) for one batch
    layers: list[LayerGroup] = field(default_factory=list)  # the grouping profiled (for callers: no regrouping)

    @property
    def prediction_error(self) -> float:
        return abs(self.predicted_step_seconds - self.measured_step_seconds) / self.measured_step_seconds


def _role(op: Any) -> int:
    try:
        return int(op.attr("op_role"))
    except Exception:  # ops added outside a role guard
        return FORWARD


def _is_forward(op: Any) -> bool:
    return _role(op) in (FORWARD, LOSS) and op.type not in ("feed", "fetch")


def _per_sample(shape: Any) -> int:
    """Elements per sample: the batch dimension (-1) left out."""
    size = 1
    for dim in shape:
        if dim != -1:
            size *= max(int(dim), 1)
    return size


def _dtype_bytes(var: Any) -> int:
    name = str(var.dtype).split(".")[-1].lower()
    for key, value in DTYPE_BYTES.items():
        if key in name:
            return value
    return 4


def _forward_var(name: str) -> str:
    return name.split("@GRAD")[0]


def group_layers(
    program: Any, ids_per_sample: dict[str, float] | None = None
) -> tuple[list[LayerGroup], dict[int, int]]:
    """Layers in program order, and op index -> layer index for every op of block 0 (all roles)."""
    block = program.global_block()
    ops = list(block.ops)
    ids_per_sample = ids_per_sample or {}
    params = {p.name for p in block.all_parameters()}
    layers: list[LayerGroup] = []
    pending: list[int] = []  # forward ops seen before the first layer starts
    op_layer: dict[int, int] = {}
    producer_layer: dict[str, int] = {}
    param_layer: dict[str, int] = {}
    for index, op in enumerate(ops):
        if not _is_forward(op):
            continue
        current = layers[-1] if layers else None
        if op.type in LOOKUP_OPS:
            table = op.input("W")[0]
            if current is None or current.kind != "sparse" or current.table != table:
                layers.append(LayerGroup(f"embedding_{sum(g.kind == 'sparse' for g in layers)}", "sparse", table))
            rows = ids_per_sample.get(op.input("Ids")[0], 1.0)
            dim = _per_sample(block.var(table).shape[1:])
            layers[-1].rows_per_sample += rows
            # Rows read, and written back by the sparse update, per sample.
            layers[-1].io_bytes += rows * dim * _dtype_bytes(block.var(table)) * 2
        elif op.type in MATMUL_OPS and any(n in params for n in op.input_arg_names):
            layers.append(LayerGroup(f"fc_{sum(g.kind == 'dense' for g in layers)}", "dense"))
        elif current is None:
            pending.append(index)
            continue
        layer_index = len(layers) - 1
        for i in pending + [index]:
            layers[layer_index].op_indices.append(i)
            op_layer[i] = layer_index
            layers[layer_index].flops += _forward_flops(block, ops[i])
            for name in ops[i].output_arg_names:
                producer_layer.setdefault(name, layer_index)
            for name in ops[i].input_arg_names:
                if name in params and name not in param_layer:
                    param_layer[name] = layer_index
                    layers[layer_index].params.append(name)
        pending = []
    if not layers:
        raise ValueError("program has no lookup or parameter matmul ops to group into layers")
    # Backward and optimizer ops: the layer of the variable whose gradient they make, or of the parameter they
    # update; failing both, the layer of the op before them.
    previous = len(layers) - 1
    for index, op in enumerate(ops):
        if index in op_layer or op.type in ("feed", "fetch"):
            continue
        owner = None
        for name in op.output_arg_names + op.input_arg_names:
            base = _forward_var(name)
            if base in param_layer:
                owner = param_layer[base]
                break
            if "@GRAD" in name and base in producer_layer:
                owner = producer_layer[base]
                break
        owner = previous if owner is None else owner
        op_layer[index] = owner
        previous = owner
    return layers, op_layer


def _forward_flops(block: Any, op: Any) -> float:
    """Forward+backward FLOPs per sample of one forward op (backward ~2x forward for matmuls, 1x otherwise)."""
    if op.type in LOOKUP_OPS or op.type in ("feed", "fetch"):
        return 0.0
    if op.type in MATMUL_OPS:
        x = block.var(op.input_arg_names[0])
        y = block.var(op.input_arg_names[1])
        k_by_n = _per_sample(y.shape) if y.persistable else _per_sample(y.shape[-2:])
        rows = _per_sample(x.shape[:-1]) if len(x.shape) > 2 else 1
        return 3 * 2.0 * rows * k_by_n
    outputs = [block.var(n) for n in op.output_arg_names if block.has_var(n) and not block.var(n).persistable]
    return 2.0 * sum(_per_sample(v.shape) for v in outputs if v.shape is not None)


def _state_factor(program: Any) -> int:
    for op in program.global_block().ops:
        if op.type in OPTIMIZER_STATE:
            return OPTIMIZER_STATE[op.type]
    return DEFAULT_STATE


def static_layer_sizes(program: Any, layers: list[LayerGroup]) -> list[dict[str, float]]:
    """flops, param_bytes (with optimizer state), io_bytes, out_bytes per layer."""
    block = program.global_block()
    ops = list(block.ops)
    state = _state_factor(program)
    produced_by: dict[str, int] = {}
    consumed_last: dict[str, int] = {}
    for layer_index, layer in enumerate(layers):
        for i in layer.op_indices:
            for name in ops[i].output_arg_names:
                produced_by.setdefault(name, layer_index)
            for name in ops[i].input_arg_names:
                consumed_last[name] = max(consumed_last.get(name, -1), layer_index)
    sizes = []
    for layer_index, layer in enumerate(layers):
        param_bytes = (
            sum(_per_sample([abs(d) for d in block.var(p).shape]) * _dtype_bytes(block.var(p)) for p in layer.params)
            * state
        )
        crossing = 0.0
        for name, producer in produced_by.items():
            var = block.var(name) if block.has_var(name) else None
            if var is None or var.persistable or producer > layer_index:
                continue
            if consumed_last.get(name, -1) > layer_index:
                # Activation forward, and its gradient backward when it is a float tensor.
                factor = 2 if _dtype_bytes(var) in (2, 4) and "int" not in str(var.dtype).lower() else 1
                crossing += _per_sample(var.shape) * _dtype_bytes(var) * factor
        sizes.append(
            {"flops": layer.flops, "param_bytes": float(param_bytes), "io_bytes": layer.io_bytes, "out_bytes": crossing}
        )
    return sizes


def ids_per_sample(feed: dict[str, Any], batch_size: int) -> dict[str, float]:
    counts = {}
    for name, value in feed.items():
        try:
            counts[name] = float(np.array(value).size) / batch_size
        except Exception:
            continue
    return counts


@dataclass(frozen=True)
class StepTrace:
    op_seconds: dict[int, float]  # op index -> seconds of its operator events
    op_events: dict[int, int]  # op index -> how many operator events were counted for it
    span_seconds: float  # the whole profiled step, gaps between ops included


def measure_op_seconds(
    program: Any, feed: dict[str, Any], fetch_list: Any, executor: Any, steps: int = 4
) -> list[StepTrace]:
    """Per profiled step: op index -> seconds, from the Chrome trace (serial executor: one event per op, in
    block order). Framework events that are not block ops (feed, share_buffer, fetch) go to the op before them."""
    ops = list(program.global_block().ops)
    with tempfile.TemporaryDirectory() as trace_dir:
        prof = profiler.Profiler(
            targets=[profiler.ProfilerTarget.CPU],
            scheduler=(1, 1 + steps),
            on_trace_ready=profiler.export_chrome_tracing(trace_dir),
        )
        prof.start()
        for _ in range(steps + 2):
            executor.run(program, feed=feed, fetch_list=fetch_list)
            prof.step()
        prof.stop()
        files = glob.glob(os.path.join(trace_dir, "*.json"))
        if not files:
            raise RuntimeError("paddle.profiler wrote no trace")
        with open(files[0], encoding="utf-8") as handle:
            document = json.load(handle)
    events = document["traceEvents"] if isinstance(document, dict) else document
    step_spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "ProfileStep")
    operator_events = sorted((e for e in events if e.get("cat") == "Operator"), key=lambda e: e["ts"])
    per_step = []
    for begin, end in step_spans:
        seconds: dict[int, float] = {}
        counts: dict[int, int] = {}
        cursor, last_matched = 0, 0
        for event in operator_events:
            if not (begin <= event["ts"] < end):
                continue
            op_type = event["name"].split("[")[0]
            match = next((i for i in range(cursor, len(ops)) if ops[i].type == op_type), None)
            if match is not None and op_type not in ("feed", "fetch"):
                cursor, last_matched = match + 1, match
                target = match
            else:
                target = last_matched
            seconds[target] = seconds.get(target, 0.0) + event["dur"] * 1e-6
            counts[target] = counts.get(target, 0) + 1
        per_step.append(StepTrace(seconds, counts, (end - begin) * 1e-6))
    return per_step


def profile_program(
    main_program: Any,
    startup_program: Any,
    feed: dict[str, Any],
    batch_size: int,
    fetch_list: Any = None,
    name: str = "model",
    time_key: str | None = "local_cpu",
    steps: int = 4,
    timing_steps: int = 8,
    measure: bool = True,
) -> ProfileReport:
    """Profile any static program (optimizer applied or not) on the local CPU.

    ``time_key``: the resource type name under which measured per-sample times are written (None: not written).
    ``measure=False``: sizes only, nothing is run (the step-time figures are then NaN).
    """
    # One op at a time, so the trace's operator events follow the block order and per-op times add up to the
    # step (with the default thread pool, ops overlap and their durations sum to more than the step). Set at run
    # time: the environment variable only counts if set before Paddle was first imported.
    paddle.enable_static()
    layers, op_layer = group_layers(main_program, ids_per_sample(feed, batch_size))
    sizes = static_layer_sizes(main_program, layers)
    if not measure:
        profile = ModelProfile(
            name=name,
            batch_size=batch_size,
            layers=tuple(
                LayerProfile(name=layer.name, kind=layer.kind, time={}, **size) for layer, size in zip(layers, sizes)
            ),
        )
        return ProfileReport(profile, math.nan, math.nan, layers)
    serial_flag = "FLAGS_new_executor_serial_run"
    previous = paddle.get_flags([serial_flag])[serial_flag]
    paddle.set_flags({serial_flag: True})
    try:  # the flag is process-wide: a job profiled in its own process (auto path) must get its threads back
        executor = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            executor.run(startup_program)
            for _ in range(2):  # warm-up: first runs build the interpreter and allocate
                executor.run(main_program, feed=feed, fetch_list=fetch_list)
            # Wall-clock steps before and after the profiled ones: on a shared machine the load drifts, and the
            # prediction is checked against the same period the per-layer times come from.
            wall = _timed_steps(executor, main_program, feed, fetch_list, (timing_steps + 1) // 2)
            per_step = measure_op_seconds(main_program, feed, fetch_list, executor, steps)
            wall += _timed_steps(executor, main_program, feed, fetch_list, timing_steps // 2)
    finally:
        paddle.set_flags({serial_flag: previous})
    layer_seconds = [[0.0] * len(layers) for _ in per_step]
    for step, trace in enumerate(per_step):
        # The executor's time between operator events (dispatch, feed and fetch) is part of running the ops:
        # shared out over the layers by how many events each had.
        gap = max(0.0, trace.span_seconds - sum(trace.op_seconds.values()))
        total_events = max(1, sum(trace.op_events.values()))
        for op_index, value in trace.op_seconds.items():
            share = gap * trace.op_events[op_index] / total_events
            layer_seconds[step][op_layer.get(op_index, len(layers) - 1)] += value + share
    medians = [statistics.median(step[i] for step in layer_seconds) for i in range(len(layers))]
    profiles = []
    for layer, size, seconds in zip(layers, sizes, medians):
        times = {time_key: seconds / batch_size} if time_key else {}
        profiles.append(
            LayerProfile(
                name=layer.name,
                kind=layer.kind,
                flops=size["flops"],
                param_bytes=size["param_bytes"],
                io_bytes=size["io_bytes"],
                out_bytes=size["out_bytes"],
                time=times,
            )
        )
    profile = ModelProfile(name=name, batch_size=batch_size, layers=tuple(profiles))
    return ProfileReport(profile, statistics.median(wall), sum(medians), layers)


def _timed_steps(executor: Any, program: Any, feed: dict[str, Any], fetch_list: Any, count: int) -> list[float]:
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        executor.run(program, feed=feed, fetch_list=fetch_list)
        seconds.append(time.perf_counter() - started)
    return seconds


def is_finite_profile(profile: ModelProfile) -> bool:
    return all(
        math.isfinite(v)
        for layer in profile.layers
        for v in (layer.flops, layer.param_bytes, layer.io_bytes, layer.out_bytes, *layer.time.values())
    )
