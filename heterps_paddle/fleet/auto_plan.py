"""The automatic path of ``strategy.heterps``: the plan a job runs, made inside ``minimize`` within its launch.

Called from HeterPSOptimizer when ``heterps_configs["cluster"]`` names a cluster file, or is ``"local"`` (this
machine, measured once: measure/local_cluster.py).

- **The launch is part of the cluster.**  What ``paddle.distributed.launch`` started (CPU trainers, heterogeneous
  trainers per stage and their device) bounds the plan; the cluster file prices and times the types.  The job
  runs the best plan that fits its launch (planning/launch_fit.py); when another launch would do better, the
  report says which, with the arguments, and the job still runs.
- **Stable.**  Measured inputs (the program's profile, this machine's figures, the servers' cost per row) are
  measured once and cached with what they depend on (measure/cache.py); the plan file records a digest of
  every input, and a later launch with the same inputs reuses it (``replan`` forces a new one).
- **One plan per launch.**  The first trainer of a launch to lock ``output_dir`` plans (or reuses) and writes
  ``plan.json``, ``plan_report.txt`` and ``profile.yaml``, then stamps ``plan.launch`` with the launch's id (the
  endpoints the launcher hands every process); the launch's other trainers read that plan.  Parameter servers
  are not told the stages by the launcher, so they never plan: they wait for the stamp.  A launch across hosts
  (``heterps launch --hosts``) plans on stage 1's trainer 0 and publishes the plan through the launch's
  coordinator (fleet/plan_agreement.py); another multi-host launch needs ``output_dir`` on storage the hosts
  share (HETERPS_SHARED_OUTPUT_DIR=1), or a saved plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

import paddle

from heterps_paddle import graph_seam, rendezvous, settings
from heterps_paddle.errors import EXIT_INFEASIBLE, HeterPSError
from heterps_paddle.files import locked, write_atomic
from heterps_paddle.fleet import host_measure, plan_agreement
from heterps_paddle.fleet.plan_files import (
    CLUSTER_FILE,
    LAUNCH_FILE,
    LOCAL_CLUSTER,
    LOCK_FILE,
    PLAN_FILE,
    PROFILE_FILE,
    REPORT_FILE,
    overwrites_an_input,
)
from heterps_paddle.log import logger
from heterps_paddle.measure.cache import cached, digest
from heterps_paddle.measure.local_cluster import LOCAL_CPU, LOCAL_GPU, detect_local_cluster
from heterps_paddle.planning.launch import LaunchShape, env_outside_the_launch, launch_from_env
from heterps_paddle.planning.launch_fit import fit_to_launch
from heterps_paddle.planning.model import (
    Cluster,
    ModelProfile,
    Plan,
    PlanningInputError,
    cluster_from_dict,
    cluster_to_dict,
    load_cluster,
    load_model_profile,
    load_plan,
    model_profile_to_dict,
    plan_from_dict,
    save_plan,
    save_yaml,
)
from heterps_paddle.planning.planner import launchable_cost_model
from heterps_paddle.planning.replan import PlanningInputs
from heterps_paddle.planning.report import JobReportInputs, job_report
from heterps_paddle.program.job_profile import PROFILE_METHOD, JobProfile, measure_job, program_digest
from heterps_paddle.version import __version__

ADVICE_TIMEOUT_S = 600.0
# The resource types a profile measured on this machine stands for (heterps local-cluster's names).
LOCAL_TYPES = (LOCAL_CPU, LOCAL_GPU)


class PlanningFailed(HeterPSError):
    pass


@dataclass(frozen=True)
class JobPlan:
    plan: Plan
    plan_path: str
    report: str
    how: str  # "planned" | "reused" (same inputs as an earlier launch) | "shared" (another process of this launch)
    # What the plan was made from (planning/replan.py: PlanningInputs.to_dict), for a restart's new plan across
    # hosts; None where this process did not plan.
    inputs: dict[str, Any] | None = None


def _launch_hosts() -> set[str]:
    hosts = set()
    for key in rendezvous.LAUNCH_ENDPOINT_ENV:
        for endpoint in filter(None, os.environ.get(key, "").replace(";", ",").split(",")):
            hosts.add(endpoint.rsplit(":", 1)[0])
    return hosts


def _cuda() -> bool:
    return bool(paddle.device.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0


def _read_if(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _launch_plan(out_dir: str, this_launch: str | None) -> JobPlan | None:
    """The plan another process of this launch made (or reused), if it has stamped one."""
    if this_launch is None or (_read_if(os.path.join(out_dir, LAUNCH_FILE)) or "").strip() != this_launch:
        return None
    plan_path = os.path.join(out_dir, PLAN_FILE)
    return JobPlan(load_plan(plan_path), plan_path, _read_if(os.path.join(out_dir, REPORT_FILE)) or "", "shared")


def _wait_for_launch_plan(out_dir: str, this_launch: str | None) -> JobPlan:
    if this_launch is None:
        raise PlanningFailed("a parameter server outside a paddle.distributed.launch job cannot wait for a plan")
    wait = float(settings.get("HETERPS_PLAN_WAIT_S"))  # type: ignore[arg-type]
    logger.info(
        "parameter server: waiting (up to %.0f s) for the plan a trainer of this launch makes in %s", wait, out_dir
    )
    deadline = time.monotonic() + wait
    while True:
        with locked(out_dir, LOCK_FILE):
            found = _launch_plan(out_dir, this_launch)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise PlanningFailed(
                f"no trainer of this launch wrote a plan to {out_dir} within {wait:.0f} s "
                "(HETERPS_PLAN_WAIT_S); see the trainers' logs"
            )
        time.sleep(0.5)


def _local_measurement() -> Any:
    return cached("local_cluster", {"method": 1}, lambda: cluster_to_dict(detect_local_cluster()))


def local_cluster() -> Cluster:
    """``cluster: local``: this machine, measured once and cached (its types priced as the report prices them)."""
    measurement = _local_measurement()
    return cluster_from_dict(measurement.value, measurement.path)


def _cluster(configs: dict[str, Any], out_dir: str) -> tuple[Cluster, str, int | None]:
    """The cluster, how to name it in the report, and the cores every process shares (the local cluster)."""
    if configs["cluster"] != LOCAL_CLUSTER:
        return load_cluster(configs["cluster"]), configs["cluster"], None
    measurement = _local_measurement()
    cluster = cluster_from_dict(measurement.value, measurement.path)
    how = "reused" if measurement.reused else "measured"
    return (
        cluster,
        f"local (this machine, {how} {measurement.measured_at}; {os.path.join(out_dir, CLUSTER_FILE)})",
        os.cpu_count(),
    )


def plan_for_job(loss: Any, startup_program: Any, optimizer: Any, configs: dict[str, Any]) -> JobPlan:
    """The launch's plan (module doc); raises PlanningFailed naming what failed."""
    overwrites = overwrites_an_input(configs)  # asked at the assignment too; the launch's inputs are known here
    if overwrites is not None:
        raise PlanningFailed(overwrites)
    out_dir = os.path.abspath(configs["output_dir"])
    os.makedirs(out_dir, exist_ok=True)
    this_launch = rendezvous.launch_id()
    if rendezvous.across_hosts():
        return _plan_across_hosts(loss, startup_program, optimizer, configs, out_dir)
    if len(_launch_hosts()) > 1 and not settings.get("HETERPS_SHARED_OUTPUT_DIR"):
        raise PlanningFailed(
            f"this launch spans hosts {sorted(_launch_hosts())}: each would plan on its own and could choose "
            "different plans. Launch it with `heterps launch --hosts HOSTS --plan PLAN` (one plan, published to "
            "every host), or pass a saved plan as heterps_configs['plan'], or set HETERPS_SHARED_OUTPUT_DIR=1 if "
            f"output_dir ({out_dir}) is storage every host shares."
        )
    job: JobPlan | None
    if os.environ.get("TRAINING_ROLE") == "PSERVER":
        job = _wait_for_launch_plan(out_dir, this_launch)
        logger.info(
            "parameter server: runs plan %s (%d stage%s)",
            job.plan_path,
            job.plan.num_stages,
            "s" * (job.plan.num_stages != 1),
        )
        return job
    launch = launch_from_env() or LaunchShape(1)
    with locked(out_dir, LOCK_FILE):
        job = _launch_plan(out_dir, this_launch)
        if job is None:
            try:
                job = _plan_locked(loss, startup_program, optimizer, configs, out_dir, launch)
            except PlanningInputError as exc:
                raise PlanningFailed(f"planning inside minimize failed: {exc}") from None
            write_atomic(os.path.join(out_dir, LAUNCH_FILE), this_launch or f"pid-{os.getpid()}")
    if job.inputs is None:
        # made by another trainer of this launch: its inputs (the cluster's prices among them: the launch's gauge
        # prices the job from what trainer 0 publishes) from the profile and cluster saved beside the plan
        inputs = _saved_inputs(out_dir, job.plan.required_throughput, job.plan.budget_per_hour, configs, _cuda())
        job = replace(job, inputs=inputs)
    print(f"heterps: plan {job.how}: {job.plan_path}\n{job.report}", flush=True)
    return job


def _plan_across_hosts(
    loss: Any, startup_program: Any, optimizer: Any, configs: dict[str, Any], out_dir: str
) -> JobPlan:
    """A launch across hosts (``heterps launch --hosts``): stage 1's trainer 0 plans on its host, within the launch,
    and publishes the plan on the launch's board (fleet/plan_agreement.py); every other process of every host
    takes that plan and keeps a copy in its own output_dir."""
    if configs["cluster"] == LOCAL_CLUSTER:
        raise PlanningFailed(
            "cluster: local measures only the machine it runs on, and this launch spans hosts of other types: give "
            "heterps_configs['cluster'] a cluster file with every host's type (`heterps local-cluster --out FILE` on "
            "a machine of each type measures it), or a saved plan as heterps_configs['plan']"
        )
    if plan_agreement.publishes_the_plan():
        with locked(out_dir, LOCK_FILE):
            try:
                job = _plan_locked(
                    loss, startup_program, optimizer, configs, out_dir, launch_from_env() or LaunchShape(1)
                )
            except PlanningInputError as exc:
                raise PlanningFailed(f"planning inside minimize failed: {exc}") from None
        print(f"heterps: plan {job.how}: {job.plan_path}\n{job.report}", flush=True)
        return job
    if host_measure.my_type() is not None:
        # while trainer 0 plans: this host's type timed here, so that no plan is made on the file's word for it
        measure_for_the_launch(loss, startup_program, optimizer, configs, _cluster(configs, out_dir)[0])
    try:
        plan, report = plan_agreement.published_plan(f"{os.environ.get('TRAINING_ROLE', 'process')} on the launch")
    except plan_agreement.PlanDisagreement as exc:
        raise PlanningFailed(str(exc)) from None
    plan_path = os.path.join(out_dir, PLAN_FILE)
    with locked(out_dir, LOCK_FILE):
        save_plan(plan, plan_path)
        write_atomic(os.path.join(out_dir, REPORT_FILE), report)
    logger.info(
        "runs the plan stage 1's trainer 0 published (%d stage%s)", plan.num_stages, "s" * (plan.num_stages != 1)
    )
    return JobPlan(plan, plan_path, report, "shared")


def _profile_depends_on(loss: Any, optimizer: Any, configs: dict[str, Any], time_keys: list[str]) -> dict[str, Any]:
    """What a measured profile depends on (measure/cache.py keeps it by this, per machine)."""
    return {
        "program": program_digest(loss.block.program),
        "optimizer": type(optimizer).__name__,
        "learning_rate": repr(graph_seam.optimizer_setting(optimizer, "learning_rate")),
        "batch_size": configs["profile_batch_size"],
        "seed": configs["seed"],
        "time_keys": time_keys,
        "method": PROFILE_METHOD,
    }


def _plan_locked(
    loss: Any, startup_program: Any, optimizer: Any, configs: dict[str, Any], out_dir: str, launch: LaunchShape
) -> JobPlan:
    cluster, cluster_source, host_cores = _cluster(configs, out_dir)
    budget = configs["budget"]
    # A budget replaces the target, the cluster file's included: the user asked for the most samples/s within it.
    if budget is not None:
        target = None
    else:
        target = configs["throughput"] if configs["throughput"] is not None else cluster.throughput
    time_keys = [name for name in cluster.type_names() if name in LOCAL_TYPES]
    own = host_measure.my_type()  # a launch across hosts names this process to time its host's type too
    if own is not None and own in cluster.type_names() and own not in time_keys:
        time_keys.append(own)
    cuda = _cuda()
    depends_on = _profile_depends_on(loss, optimizer, configs, time_keys)
    if own is not None:
        depends_on["row_cost"] = _row_cost_types(cluster, time_keys)
    inputs_digest = digest(
        {
            "profile": depends_on,
            "cluster": cluster_to_dict(cluster),
            "target": target,
            "budget": budget,
            "launch": launch.to_dict(),
            "scheduler": configs["scheduler"],
            "seed": configs["seed"],
            "host_cores": host_cores,
            "cuda": cuda,
            "heterps": __version__,
        }
    )
    plan_path = os.path.join(out_dir, PLAN_FILE)
    report_path = os.path.join(out_dir, REPORT_FILE)
    if not configs["replan"] and os.path.isfile(plan_path):
        try:
            earlier = load_plan(plan_path)
        except PlanningInputError:
            earlier = None  # unreadable: plan again (and overwrite it)
        report = _read_if(report_path)
        if earlier is not None and earlier.inputs_digest == inputs_digest and report is not None:
            return JobPlan(earlier, plan_path, report, "reused", _saved_inputs(out_dir, target, budget, configs, cuda))

    logger.info(
        "planning inside minimize for this launch (%s): profiling the program on this machine%s",
        launch.describe(),
        " (measured once, then cached)" if time_keys else "",
    )
    measurement = _profile_measurement(
        loss, startup_program, optimizer, configs, cluster, time_keys, depends_on, configs["replan"]
    )
    measured = JobProfile.from_dict(measurement.value)
    logger.info(
        "profile %s (%s)",
        f"read from the cache, measured {measurement.measured_at}"
        if measurement.reused
        else "measured in this process",
        measurement.path,
    )
    profile, by_hosts = host_measure.gather(measured.profile)
    stand_in = not cuda
    fit = fit_to_launch(
        profile,
        cluster,
        launch,
        target,
        budget=budget,
        stand_in_gpu=stand_in,
        trainers_on_gpu=cuda,
        host_cores=host_cores,
    )
    plan = replace(fit.chosen.plan, inputs_digest=inputs_digest, budget_per_hour=budget)
    # Advice: the best plan on any launch, at the target (or at this plan's throughput without one; within the
    # budget with one).
    at = target if target is not None else plan.throughput
    profile_path, cluster_path = os.path.join(out_dir, PROFILE_FILE), os.path.join(out_dir, CLUSTER_FILE)
    save_yaml(model_profile_to_dict(profile), profile_path)
    save_yaml(cluster_to_dict(cluster), cluster_path)
    advice, advice_error = _advice(
        profile_path, cluster_path, ("--budget", budget) if budget is not None else ("--throughput", at), configs, cuda
    )
    inputs = _input_lines(measured, measurement, time_keys) + [f"measure before betting: {m.line()}" for m in by_hosts]
    report = job_report(
        JobReportInputs(
            fit=fit,
            cluster=cluster,
            cluster_source=cluster_source,
            advice=advice,
            advice_error=advice_error,
            advice_scheduler=configs["scheduler"],
            # the same launchable rules as the advice: only plans a launch of this cluster here can run
            alternatives=launchable_cost_model(profile, cluster, at, _trainer_kinds(cuda)),
            stand_ins=tuple(
                t.name for t in cluster.resource_types if t.kind == "gpu" and t.name in LOCAL_TYPES and stand_in
            ),
            inputs=tuple(inputs),
            digest=inputs_digest,
            reused_from=None,
            cuda=cuda,
        )
    )
    save_plan(plan, plan_path)
    write_atomic(report_path, report)
    inputs_record = PlanningInputs(
        profile, cluster, target, budget, configs["scheduler"], configs["seed"], _trainer_kinds(cuda)
    ).to_dict()
    return JobPlan(plan, plan_path, report, "planned", inputs_record)


def _row_cost_types(cluster: Cluster, time_keys: list[str]) -> tuple[str, ...]:
    """The timed types whose sparse layers pay the servers' work per row (program/job_profile.py): the local CPU
    type, and a host's cpu type timed on it."""
    kinds = {t.name: t.kind for t in cluster.resource_types}
    return tuple(k for k in time_keys if k == LOCAL_CPU or (k not in LOCAL_TYPES and kinds.get(k) == "cpu"))


def measure_for_the_launch(
    loss: Any, startup_program: Any, optimizer: Any, configs: dict[str, Any], cluster: Cluster
) -> None:
    """A process a launch across hosts named to time its host's type (fleet/host_measure.py): the job's profile
    with that type's times, measured here and cached on this machine, published for trainer 0 to plan on."""

    def measure(rtype: str) -> ModelProfile:
        keys = [rtype]
        depends_on = {**_profile_depends_on(loss, optimizer, configs, keys), "row_cost": _row_cost_types(cluster, keys)}
        measured = _profile_measurement(loss, startup_program, optimizer, configs, cluster, keys, depends_on)
        return JobProfile.from_dict(measured.value).profile

    host_measure.measure_this_host(cluster, measure, cuda=_cuda())


def _profile_measurement(
    loss: Any,
    startup_program: Any,
    optimizer: Any,
    configs: dict[str, Any],
    cluster: Cluster,
    time_keys: list[str],
    depends_on: dict[str, Any],
    refresh: bool = False,
) -> Any:
    """The job's profile with ``time_keys``' times measured on this machine, once (measure/cache.py keeps it by
    ``depends_on``; one whose servers' probe failed is used once and measured again next time)."""
    return cached(
        "profile",
        depends_on,
        lambda: measure_job(
            loss,
            startup_program,
            optimizer,
            configs["profile_batch_size"],
            configs["seed"],
            time_keys,
            _row_cost_types(cluster, time_keys),
        ).to_dict(),
        refresh=refresh,
        keep=lambda value: value["ps_probe_error"] is None,
    )


def _trainer_kinds(cuda: bool) -> tuple[str, ...]:
    """What a one-stage plan's trainers can be: GPU trainers only where Paddle can use a GPU."""
    return ("cpu", "gpu") if cuda else ("cpu",)


def _saved_inputs(
    out_dir: str, target: float | None, budget: float | None, configs: dict[str, Any], cuda: bool
) -> dict[str, Any] | None:
    """A reused plan's inputs, from the profile and cluster saved beside it (None if they are gone)."""
    try:
        profile = load_model_profile(os.path.join(out_dir, PROFILE_FILE))
        cluster = load_cluster(os.path.join(out_dir, CLUSTER_FILE))
    except (OSError, PlanningInputError):
        return None
    return PlanningInputs(
        profile, cluster, target, budget, configs["scheduler"], configs["seed"], _trainer_kinds(cuda)
    ).to_dict()


def _advice(
    profile_path: str, cluster_path: str, goal: tuple[str, float], configs: dict[str, Any], cuda: bool
) -> tuple[Plan | None, str | None]:
    """The best plan on any launch of the cluster, made by `heterps plan` in a process of its own (the command
    the report then names): no scheduler runs inside a training process (rl's training would take the trainer's
    time and memory there), and exact's MILP imports scipy, which cannot load in a process that imported Paddle
    first: the import fails with a zlib.error or the process dies in inflateReset2 (docs/paddle-notes.md; checked by
    tests/test_planner_process.py, which fails when that stops being true).  The same rules as the fit: a split's
    first stage is a cpu type; without CUDA the trainers of a one-stage plan are cpu types too.  Returns (plan,
    None) or (None, why there is none)."""
    command = [
        sys.executable,
        "-m",
        "heterps_paddle",
        "plan",
        "--model",
        profile_path,
        "--cluster",
        cluster_path,
        "--scheduler",
        configs["scheduler"],
        "--seed",
        str(configs["seed"]),
        goal[0],  # --throughput T or --budget B
        repr(float(goal[1])),
        "--json",
        "--trainer-kinds",
        ",".join(_trainer_kinds(cuda)),
    ]
    try:
        # cwd: outside the script's directory, where a source checkout's heterps_paddle would shadow the installed one
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=ADVICE_TIMEOUT_S,
            env=env_outside_the_launch(),
            cwd=os.path.dirname(profile_path),
        )
    except subprocess.TimeoutExpired:
        return None, f"`heterps plan` took more than {ADVICE_TIMEOUT_S:.0f} s"
    # EXIT_INFEASIBLE: no plan meets the target, which is advice too ("feasible": false, with the reason, on stdout).
    if done.returncode not in (0, EXIT_INFEASIBLE):
        return None, f"`heterps plan` failed ({done.stderr.strip().splitlines()[-1:] or done.returncode})"
    try:
        return plan_from_dict(json.loads(done.stdout), "heterps plan --json"), None
    except (ValueError, PlanningInputError) as exc:
        return None, f"`heterps plan` printed no plan ({exc})"


def _input_lines(measured: JobProfile, measurement: Any, time_keys: list[str]) -> list[str]:
    profile = measured.profile
    when = f"reused from {measurement.path}" if measurement.reused else f"measured now, cached in {measurement.path}"
    lines = [
        f"profile: {len(profile.layers)} layers at batch {profile.batch_size}, {when} (taken {measurement.measured_at})"
    ]
    if time_keys:
        lines.append(
            f"times measured on this CPU stand for {', '.join(time_keys)}; profiler check: predicted step "
            f"{measured.predicted_step_seconds:.4f} s vs measured {measured.measured_step_seconds:.4f} s"
        )
    else:
        lines.append("the cluster has no local type: every time is estimated from FLOPs and bandwidths")
    if measured.calibration:
        lines.append(
            f"layer times scaled by {measured.calibration:.3f} to the train_from_dataset loop's "
            f"{(measured.trainer_seconds or 0) * 1e6:.1f} us/sample"
        )
    if measured.ps_row_seconds is not None:
        lines.append(
            f"{LOCAL_CPU} sparse layers include the parameter servers' work, "
            f"{measured.ps_row_seconds * 1e6:.2f} us CPU per row (heterps_paddle.measure.ps_service probe)"
        )
    if measured.ps_probe_error:
        lines.append(
            f"WARNING: the servers' per-row cost was not measured ({measured.ps_probe_error}), so "
            f"{LOCAL_CPU} predictions leave it out and overestimate samples/s; the next launch measures "
            "again"
        )
    return lines
