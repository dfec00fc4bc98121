"""The automatic path of ``strategy.heterps``: profile the program, schedule, provision, once per launch.

Called from HeterPSOptimizer.minimize_impl when ``heterps_configs["cluster"]`` names a cluster file, or
is ``"local"``: this machine, measured once into ``output_dir/local_cluster.yaml`` (heterps local-cluster).

One plan per launch.  Profiling measures times, so two processes profiling the same program would not
get the same numbers and could choose different plans.  So the first process of a launch to get the
lock on ``output_dir`` profiles and plans, writes ``plan.json`` and ``plan_report.txt`` there, and every
other process of the same launch reads that file (a launch is recognised by the endpoints
``paddle.distributed.launch`` hands every process).  When a launch spans several hosts this only works if
``output_dir`` is shared storage: such a launch is refused unless ``HETERPS_SHARED_OUTPUT_DIR=1`` says it
is, or a saved plan is given instead (``heterps_configs["plan"]``, e.g. from ``heterps plan``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import locked, write_atomic
from heterps_paddle.measure.local_cluster import LOCAL_CPU, LOCAL_GPU
from heterps_paddle.planning.model import Cluster, Plan, cluster_to_dict, load_cluster, model_profile_to_dict, plan_from_dict, \
    save_yaml
from heterps_paddle.fleet.strategy import LOCAL_CLUSTER

PLAN_FILE = "plan.json"
REPORT_FILE = "plan_report.txt"
PROFILE_FILE = "profile.yaml"
LOCAL_CLUSTER_FILE = "local_cluster.yaml"
LAUNCH_FILE = "plan.launch"
# The resource types a profile measured on this machine stands for (heterps local-cluster's names).
LOCAL_TYPES = (LOCAL_CPU, LOCAL_GPU)
LAUNCH_ENV = ("PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_ALL_HETER_TRAINER_IP_PORT_LIST")


class PlanningFailed(HeterPSError):
    pass


@dataclass(frozen=True)
class JobProfile:
    profile: object  # planning.model.ModelProfile, with times under the cluster's local type names
    report: object  # planning.profiler.ProfileReport: the profiler's own check (predicted vs measured step)
    trainer_seconds: float | None  # per sample, train_from_dataset loop with local tables
    calibration: float | None  # trainer_seconds / the profiler's per-sample sum
    ps_row_seconds: float | None  # parameter servers' CPU per sparse row, added to local_cpu sparse layers
    ps_probe_error: str | None = None  # why the servers' cost could not be measured (then not added)


@dataclass
class JobPlan:
    plan: Plan
    cluster: Cluster
    plan_path: str
    report: str


def launch_id() -> str | None:
    """What every process of one launch shares and another launch does not (its random ports)."""
    parts = [os.environ.get(key, "") for key in LAUNCH_ENV]
    if not any(parts):
        return None
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def _launch_hosts() -> set[str]:
    hosts = set()
    for key in LAUNCH_ENV:
        for endpoint in filter(None, os.environ.get(key, "").replace(";", ",").split(",")):
            hosts.add(endpoint.rsplit(":", 1)[0])
    return hosts


def random_feed_for(program, batch_size: int, seed: int = 0) -> dict:
    """Plausible inputs for any static program: ids within the vocabulary of the table that reads them
    (Zipf-skewed, as CTR ids are), int64 labels in {0, 1}, floats in [0, 1)."""
    import numpy as np
    import paddle

    rng = np.random.default_rng(seed)
    block = program.global_block()
    vocab = {}
    for op in block.ops:
        if op.type in ("lookup_table", "lookup_table_v2"):
            for ids in op.input("Ids"):
                vocab[ids] = int(block.var(op.input("W")[0]).shape[0])
    feed = {}
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


def profile_for_planning(loss, startup_program, optimizer, batch_size: int, seed: int, time_keys):
    """Profile the program being minimised, on this machine's CPU, as training will run it.

    Works on copies: the user's program is untouched.  Tables that live on the parameter servers
    (``sparse_embedding``: SELECTED_ROWS parameters) become local tables in the copy, so the lookups can
    run here; the copy gets the same optimizer as the job, so optimizer ops are timed too.
    """
    import paddle

    # A fresh name generator: names made for the copy (optimizer state, learning rate) must not shift the
    # ones the job's own optimizer gets next (the PS runtime looks them up, e.g. 'learning_rate_0').
    # The copy's startup draws from the global random generator: give the job back the state it had, so
    # the process that profiled initialises its parameters as it would have without profiling.
    rng_state = paddle.get_rng_state()
    try:
        with paddle.utils.unique_name.guard():
            return _profile_copy(loss, startup_program, optimizer, batch_size, seed, time_keys)
    finally:
        paddle.set_rng_state(rng_state)


def _profile_copy(loss, startup_program, optimizer, batch_size, seed, time_keys):
    import paddle
    from paddle.base import core

    from heterps_paddle.program.profiler import profile_program

    main = loss.block.program.clone()
    startup = startup_program.clone()
    for program in (main, startup):
        for var in program.list_vars():
            if var.persistable and var.type == core.VarDesc.VarType.SELECTED_ROWS:
                shape, dtype = list(var.shape), var.dtype
                var.desc.set_type(core.VarDesc.VarType.LOD_TENSOR)  # forgets shape and dtype: restore them
                var.desc.set_shape(shape)
                var.desc.set_dtype(dtype)
    copy_loss = main.global_block().var(loss.name)
    # On the servers a sparse table updates only the rows a batch touched; a local Adam would update the
    # whole table every step (its lazy mode does what the servers do).
    options = {"lazy_mode": True} if isinstance(optimizer, paddle.optimizer.Adam) else {}
    with paddle.static.program_guard(main, startup):
        type(optimizer)(learning_rate=optimizer._learning_rate, **options).minimize(copy_loss)
    feed = random_feed_for(main, batch_size, seed)
    report = profile_program(main, startup, feed, batch_size, fetch_list=[copy_loss], name="job",
                             time_key=time_keys[0] if time_keys else None)
    profile = report.profile
    calibration = trainer_seconds = None
    if time_keys:
        # The profiler times ops under Executor.run; training runs them in the C++ trainer loop of
        # train_from_dataset, which has far less per-step overhead.  Keep the profiler's split over layers
        # and scale it to the trainer loop's measured time per sample.
        trainer_seconds = trainer_seconds_per_sample(main, startup, feed, batch_size)
        profiled = sum(layer.time[time_keys[0]] for layer in profile.layers)
        calibration = trainer_seconds / profiled if profiled > 0 else 1.0
        from dataclasses import replace

        profile = replace(profile, layers=tuple(
            replace(layer, time={key: layer.time[time_keys[0]] * calibration for key in time_keys})
            for layer in profile.layers))
    ps_row_seconds = probe_error = None
    if LOCAL_CPU in time_keys:
        from heterps_paddle.measure.ps_service import ProbeFailed

        try:
            profile, ps_row_seconds = add_ps_service_time(profile, main, feed, batch_size)
        except ProbeFailed as exc:
            # Training can go on: the plan is made without the servers' share and the report says so.
            probe_error = str(exc)
    return JobProfile(profile, report, trainer_seconds, calibration, ps_row_seconds, probe_error)


def sparse_rows_per_sample(main, feed: dict, batch_size: int) -> dict[str, float]:
    """Sparse layer name -> table rows it looks up per sample (what the servers pull and push)."""
    from heterps_paddle.program.profiler import _ids_per_sample, group_layers

    layers, _ = group_layers(main, _ids_per_sample(feed, batch_size))
    return {layer.name: layer.rows_per_sample for layer in layers if layer.kind == "sparse"}


def add_ps_service_time(profile, main, feed: dict, batch_size: int):
    """The local CPU type's sparse-layer times with the parameter servers' work added.

    The profile ran with local tables.  On a CPU stage the rows are pulled from and pushed to the
    servers, which on this machine share the trainers' cores: each looked-up row costs the CPU time the
    ps_service probe measured (trainer and server side together), once per sample.  The local GPU type
    keeps the local-table time: a GPU stage's embeddings live in the project's table, synchronised with
    the servers once per pass, not per sample.
    """
    from dataclasses import replace

    from heterps_paddle.measure.ps_service import ps_row_cost

    row_seconds = ps_row_cost().row_seconds
    rows = sparse_rows_per_sample(main, feed, batch_size)
    layers = []
    for layer in profile.layers:
        if layer.name in rows and LOCAL_CPU in layer.time:
            layer = replace(layer, time={**layer.time, LOCAL_CPU: layer.time[LOCAL_CPU] + rows[layer.name] * row_seconds})
        layers.append(layer)
    return replace(profile, layers=tuple(layers)), row_seconds


def _multislot_line(values_by_var, row: int) -> str:
    parts = []
    for values in values_by_var:
        row_values = values[row].reshape(-1)
        parts.append(str(row_values.size))
        parts.append(" ".join(map(str, row_values.tolist())))
    return " ".join(parts)


def trainer_seconds_per_sample(main, startup, feed: dict, batch_size: int, batches: int = 24) -> float:
    """Seconds per sample of ``main`` run by train_from_dataset (one thread) over ``batches`` batches made
    by repeating the profiling feed, in a scratch scope: what one trainer unit does per sample."""
    import tempfile
    import time

    import numpy as np
    import paddle

    feed_vars = [var for var in main.global_block().vars.values() if getattr(var, "is_data", False)]
    values = [np.array(feed[var.name]) for var in feed_vars]
    with tempfile.TemporaryDirectory(prefix="heterps-calibrate-") as tmp:
        path = os.path.join(tmp, "data")
        with open(path, "w", encoding="utf-8") as f:
            lines = "\n".join(_multislot_line(values, row) for row in range(batch_size)) + "\n"
            for _ in range(batches):
                f.write(lines)
        dataset = paddle.distributed.QueueDataset()
        dataset.init(batch_size=batch_size, thread_num=1, pipe_command="cat", use_var=feed_vars)
        dataset.set_filelist([path])
        executor = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            executor.run(startup)
            executor.train_from_dataset(main, dataset, scope=scope)  # warm-up pass
            started = time.perf_counter()
            executor.train_from_dataset(main, dataset, scope=scope)
            elapsed = time.perf_counter() - started
    return elapsed / (batches * batch_size)


def plan_report(cost_model, plan: Plan) -> str:
    """The plan, then the all-CPU plan and the best single GPU type plan at the same target (priced without
    the runtime's first-stage constraint: what a GPU-only job would cost)."""
    from heterps_paddle.tools.plan_command import format_summary
    from heterps_paddle.planning.cost_model import CostModel

    lines = [format_summary(cost_model, plan), "", "single-type alternatives at the same target:"]
    cost_model = CostModel(cost_model.profile, cost_model.cluster, cost_model.throughput)
    types = cost_model.cluster.resource_types
    for kind in ("cpu", "gpu"):
        best = None
        for evaluation, rtype in zip(cost_model.single_type_evaluations(), types):
            if rtype.kind == kind and evaluation.feasible and (best is None or
                                                               evaluation.cost_per_hour < best[0].cost_per_hour):
                best = (evaluation, rtype)
        if best is None:
            lines.append(f"  all-{kind.upper()}: no single {kind} type meets the target within max_units")
        else:
            alt = cost_model.to_plan(best[0].assignment, f"all-{kind}", evaluations=0)
            lines.append(f"  all-{kind.upper()} ({best[1].name}): {sum(s.units for s in alt.stages)} units, "
                         f"{alt.throughput:,.0f} samples/s, {alt.cost_per_hour:.4g}/h, "
                         f"{alt.cost_per_million_samples:.4g} per million samples")
    return "\n".join(lines)


def plan_for_job(loss, startup_program, optimizer, configs: dict) -> JobPlan:
    """The launch's plan: read from output_dir if another process of this launch made it, else made here."""
    from heterps_paddle.planning.cost_model import CostModel
    from heterps_paddle.planning.schedulers import make_scheduler

    out_dir = os.path.abspath(configs["output_dir"])
    cluster_path = configs["cluster"]
    if cluster_path == LOCAL_CLUSTER:
        cluster_path = os.path.join(out_dir, LOCAL_CLUSTER_FILE)
        with locked(out_dir, ".heterps-plan.lock"):  # measured once per output_dir, then reused
            if not os.path.isfile(cluster_path):
                from heterps_paddle.measure.local_cluster import detect_local_cluster

                save_yaml(cluster_to_dict(detect_local_cluster()), cluster_path)
    cluster = load_cluster(cluster_path).with_throughput(configs["throughput"])
    if cluster.throughput is None:
        raise PlanningFailed(f"strategy.heterps_configs: no throughput target: give 'throughput' or put one in "
                             f"{configs['cluster']}")
    plan_path = os.path.join(out_dir, PLAN_FILE)
    this_launch = launch_id()
    if len(_launch_hosts()) > 1 and os.environ.get("HETERPS_SHARED_OUTPUT_DIR") != "1":
        raise PlanningFailed(
            f"this launch spans hosts {sorted(_launch_hosts())}: each would profile and plan on its own and could "
            "choose different plans. Make the plan once (`heterps plan` on a profile, or one run) and pass it as "
            "heterps_configs['plan'], or set HETERPS_SHARED_OUTPUT_DIR=1 if output_dir "
            f"({out_dir}) is storage every host shares.")
    with locked(out_dir, ".heterps-plan.lock"):
        launch_path = os.path.join(out_dir, LAUNCH_FILE)
        if this_launch and os.path.isfile(plan_path) and os.path.isfile(launch_path):
            with open(launch_path, encoding="utf-8") as f:
                made_by = f.read().strip()
            if made_by == this_launch:
                with open(plan_path, encoding="utf-8") as f:
                    plan = plan_from_dict(json.load(f), plan_path)
                with open(os.path.join(out_dir, REPORT_FILE), encoding="utf-8") as f:
                    return JobPlan(plan, cluster, plan_path, f.read())
        time_keys = [name for name in cluster.type_names() if name in LOCAL_TYPES]
        measured = profile_for_planning(loss, startup_program, optimizer, configs["profile_batch_size"],
                                        configs["seed"], time_keys)
        profile = measured.profile
        # Paddle's heterogeneous pipeline reads data on its CPU trainers, which run the first stage.
        cost_model = CostModel(profile, cluster, first_stage_kinds=("cpu",))
        plan = make_scheduler(configs["scheduler"], seed=configs["seed"]).plan(cost_model)
        report = plan_report(cost_model, plan)
        report += (f"\nprofile: {len(profile.layers)} layers measured on this CPU ({', '.join(time_keys) or 'none'}"
                   f" of the cluster's types); predicted step {measured.report.predicted_step_seconds:.4f} s vs "
                   f"measured {measured.report.measured_step_seconds:.4f} s at batch {profile.batch_size}"
                   + (f"; layer times scaled by {measured.calibration:.3f} to the train_from_dataset loop's "
                      f"{measured.trainer_seconds * 1e6:.1f} us/sample" if measured.calibration else "")
                   + (f"; {LOCAL_CPU} sparse layers include the parameter servers' work, "
                      f"{measured.ps_row_seconds * 1e6:.2f} us CPU per row (heterps_paddle.measure.ps_service probe)"
                      if measured.ps_row_seconds is not None else "")
                   + (f"; WARNING: the servers' per-row cost was not measured ({measured.ps_probe_error}), so "
                      f"{LOCAL_CPU} predictions leave it out and overestimate samples/s"
                      if measured.ps_probe_error else "") + "\n")
        save_yaml(model_profile_to_dict(profile), os.path.join(out_dir, PROFILE_FILE))
        write_atomic(plan_path, plan.to_json(indent=1))
        write_atomic(os.path.join(out_dir, REPORT_FILE), report)
        write_atomic(os.path.join(out_dir, LAUNCH_FILE), this_launch or f"pid-{os.getpid()}")
    if not plan.feasible:
        raise PlanningFailed(f"no plan meets the target on {configs['cluster']}: {plan.reason} "
                             f"(report: {os.path.join(out_dir, REPORT_FILE)})")
    return JobPlan(plan, cluster, plan_path, report)
