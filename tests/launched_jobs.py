"""The launched jobs' harness, shared by tests/test_host_restarts.py and tests/test_launched_steady_job.py: hosts on
loopback addresses, each in a directory of its own, launched as the README says (``heterps launch-args``)."""

import hashlib
import json
import os
import time

from conftest import split_cluster

from heterps_paddle.planning.unit_cost import cost_per_million_of
from heterps_paddle.tools.bench import adapt as bench_adapt
from heterps_paddle.tools.jobs import HostsRun, free_port_block

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "scripts", "paddlerec_style_trainer.py")
FAULTS = os.path.join(TESTS, "faults")  # sitecustomize.py: the held checkpoint
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HOSTS = (A, B, C)
STAGES = bench_adapt.SPLIT  # the split: the embedding on the two CPU hosts, the fc layers on the third
# The cluster the job plans on (conftest.split_cluster, as tests/test_auto_plan.py's): the split (embedding on the
# two CPU hosts, the fc layers on the third) is the best plan whatever the load.  This machine's types measured
# (`heterps local-cluster`) made it depend on how long the last fc layer, with the loss and AUC ops, took under
# load: at a load average near 40 its stage on one unit came out slower than one stage on two, the planner kept one
# stage, and there was nothing to move back to.
CLUSTER = split_cluster(cpu_units=2, gpu_units=1)
WAIT_S = 300
ONE_STAGE = bench_adapt.ONE_STAGE
# The adaptive tests' windows, heterps bench adapt's shortened ones, short enough that a pass holds a decision (the
# same rules, other times); each job stands for one that runs on for an hour: a move for speed alone must win back
# its own time over the horizon
ADAPT_ENV = {**bench_adapt.ADAPT_ENV, "HETERPS_ADAPT_HORIZON_S": "3600"}


def launched_setup(tmp_path_factory, data, name):
    """A module's directory, the data (100000 rows, conftest: data_100k: at 40000 rows (3 epochs) the held-out AUC
    of the same job spread by 0.015 from run to run, 0.7504-0.7653), the split's plan and its cluster file."""
    tmp = tmp_path_factory.mktemp(name)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": STAGES}))
    cluster = tmp / "cluster.yaml"
    cluster.write_text(CLUSTER)
    return {"tmp": tmp, "data": data, "plan": str(plan), "cluster": str(cluster)}


def run_job(
    setup,
    name,
    env=None,
    listed=HOSTS,
    plan=None,
    first=(),
    cluster=None,
    cpu_type="cpu_small",
    options=(),
    epochs=3,
    script_options=(),
):
    """The job on the ``listed`` hosts of its hosts file (each started, after ``first``: (address, options) of
    machines the file does not name), from ``plan`` (default: the split).  As the README says to run it: each host
    in a directory of its own with its copy of the files (hosts.yaml, its key, plan.json, cluster.yaml), the command
    ``heterps launch-args`` prints, and the script's heterps_configs only ``{"cluster": "cluster.yaml"}`` (the
    default output_dir)."""
    work = setup["tmp"] / name
    work.mkdir()
    hosts = work / "hosts.yaml"
    # one server: a checkpoint is then regrouped into the one-stage layout, which any later plan resumes from
    lines = {
        A: f"  - {{address: {A}, type: {cpu_type}, servers: 1, port: {free_port_block(A, 8)}}}\n",
        B: f"  - {{address: {B}, type: {cpu_type}, port: {free_port_block(B, 8)}}}\n",
        C: f"  - {{address: {C}, type: gpu_fast, port: {free_port_block(C, 8)}}}\n",
    }
    hosts.write_text("format: 1\nhosts:\n" + "".join(lines[address] for address in listed))
    argv = [
        SCRIPT,
        "--data",
        setup["data"],
        "--out",
        "out",
        "--cluster",
        "cluster.yaml",
        "--epochs",
        str(epochs),
        *script_options,
    ]
    run = HostsRun(
        str(hosts),
        plan or setup["plan"],
        argv,
        str(work),
        own_dirs=True,
        files=(cluster or setup["cluster"],),
        launch_options=(
            "--devices",
            "cpu",
            "--restarts",
            "2",
            "--checkpoint-dir",
            str(work / "checkpoints"),
            "--checkpoint-every",
            "1",
            *options,
        ),
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    for address, options in first:
        run.start(address, options=options)
    for address in listed:
        run.start(address)
    return run, work


def wait_until(run, what, ready):
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline and run.hosts[A].proc.poll() is None, f"waiting for {what}:\n" + "\n".join(
            h.console()[-3000:] for h in run.hosts.values()
        )
        time.sleep(0.2)


def complete(work, passes):
    return (work / "checkpoints" / f"pass-{passes:06d}" / "heterps_checkpoint.json").exists()


def heldout(run):
    """The held-out AUC CPU trainer 0 (on A) wrote."""
    with open(os.path.join(run.host_dir(A), "out", "worker-0.json")) as f:
        return json.load(f)["test_auc"]


def digests(run):
    """Every host's files as it was given them (hosts file, key, plan, cluster file), hashed."""
    found = {}
    for address in run.hosts:
        for path in run.host_files(address):
            with open(path, "rb") as f:
                found[path] = hashlib.sha256(f.read()).hexdigest()
    return found


def worker_log(run, address, round_number):
    with open(os.path.join(run.hosts[address].log_dir, f"round{round_number}", "workerlog.0")) as f:
        return f.read()


def round_costs(coordinator):
    """The measured cost per million samples of each round while it trained: its first costed window to its last
    window that trained.  The same span in every round: the last round's does not take in the job's end (its final
    checkpoint, its processes stopping), which a round ended by a move pays in the next round's start-up, left out
    of both; a loaded machine stretches those the most."""
    out = {}
    for number in sorted({r["round"] for r in coordinator.events("rates")}):
        costed = [r for r in coordinator.events("rates", round=number) if r["cost_so_far"] is not None]
        trained = [r for before, r in zip(costed, costed[1:]) if r["samples"] > before["samples"]]
        if trained:
            cost = trained[-1]["cost_so_far"] - costed[0]["cost_so_far"]
            out[number] = cost_per_million_of(cost, trained[-1]["samples"] - costed[0]["samples"])
    return out
