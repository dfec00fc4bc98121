"""A job that loses a machine goes on (``heterps launch --hosts ... --restarts N --checkpoint-dir DIR``): on hosts
emulated on loopback addresses, as in tests/test_across_hosts.py.

Three hosts: the parameter server and a CPU trainer on the first, a CPU trainer on the second, the heterogeneous
stage on the third.  The script is on the automatic path (a what-if cluster file, so that the plans do not depend
on the load) and the launch checkpoints every pass.  The heterogeneous host is killed twice, and comes back between:

1. Once checkpoint 1 is complete, the heterogeneous host dies (its launch and every process on it SIGKILLed).  The
   coordinator re-plans for the two CPU hosts left (one stage) and both start again from checkpoint 1.
2. The dead host's launch is started again, the same command as at first: it finds the job in round 1, stands by,
   and at the next checkpoint (2) the job moves back to the two-stage plan, with it.
3. It dies again, this time while checkpoint 3 is being written (tests/faults/sitecustomize.py holds CPU trainer 0
   between the servers' save and the manifest): checkpoint 3 never completes, and the two CPU hosts go on one-stage
   from checkpoint 2.

The job ends 0 no more than 0.01 held-out AUC under the same job undisturbed (and at most 0.04 above), each round
skips exactly the passes of the checkpoint it resumed from, and restarts.json says what was lost, the old and the
new plan, and the checkpoint resumed from, each time.  ``--restarts 0`` (today's behaviour) is tests/test_across_hosts.py's dead-host test.
"""

import hashlib
import json
import os
import random
import re
import signal
import statistics
import time

import pytest
from conftest import split_cluster

from heterps_paddle.planning.unit_cost import cost_per_million_of
from heterps_paddle.runtime.checkpoint_files import read_manifest, verify
from heterps_paddle.tools.bench import adapt as bench_adapt
from heterps_paddle.tools.jobs import HostsRun, Slowing, free_port_block

pytestmark = pytest.mark.launched

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "scripts", "paddlerec_style_trainer.py")
FAULTS = os.path.join(TESTS, "faults")  # sitecustomize.py: the held checkpoint
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HOSTS = (A, B, C)
STAGES = [
    {"resource": "cpu_small", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
    {"resource": "gpu_fast", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
]
# The cluster the job plans on (conftest.split_cluster, as tests/test_auto_plan.py's): the split (embedding on the
# two CPU hosts, the fc layers on the third) is the best plan whatever the load.  This machine's types measured
# (`heterps local-cluster`) made it depend on how long the last fc layer, with the loss and AUC ops, took under
# load: at a load average near 40 its stage on one unit came out slower than one stage on two, the planner kept one
# stage, and there was nothing to move back to.
CLUSTER = split_cluster(cpu_units=2, gpu_units=1)
WAIT_S = 300


@pytest.fixture(scope="module")
def setup(tmp_path_factory, heterps_cache, data_100k):
    tmp = tmp_path_factory.mktemp("restarts")
    # 100000 rows (conftest: data_100k): at 40000 rows (3 epochs) the held-out AUC of the same job spread by 0.015
    # from run to run (0.7504-0.7653)
    data = data_100k
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": STAGES}))
    cluster = tmp / "cluster.yaml"
    cluster.write_text(CLUSTER)
    return {"tmp": tmp, "data": data, "plan": str(plan), "cluster": str(cluster)}


def run_job(
    setup, name, env=None, listed=HOSTS, plan=None, first=(), cluster=None, cpu_type="cpu_small", options=(), epochs=3
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
    argv = [SCRIPT, "--data", setup["data"], "--out", "out", "--cluster", "cluster.yaml", "--epochs", str(epochs)]
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


@pytest.fixture(scope="module")
def undisturbed(setup):
    """The held-out AUC of the job on its three hosts, undisturbed (each disturbed job is compared with it)."""
    run, work = run_job(setup, "undisturbed")
    given = digests(run)
    try:
        codes = run.wait()
        assert codes == {a: 0 for a in HOSTS}, "\n".join(h.console()[-2000:] for h in run.hosts.values())
    finally:
        run.stop()
    assert digests(run) == given  # no host's files written over (its plan.json included)
    return heldout(run)


def test_a_heterogeneous_host_killed_twice_and_back_between_goes_on_from_the_checkpoints(setup, undisturbed):
    marker = setup["tmp"] / "held-checkpoint"
    faults = {
        "PYTHONPATH": os.pathsep.join(filter(None, [FAULTS, os.environ.get("PYTHONPATH")])),
        "HETERPS_TEST_HOLD_CHECKPOINT_PASS": "3",
        "HETERPS_TEST_HOLD_MARKER": str(marker),
    }
    run, work = run_job(setup, "disturbed", faults)
    given = digests(run)
    try:
        coordinator = run.hosts[A]
        wait_until(run, "checkpoint 1", lambda: complete(work, 1))
        run.kill(C)  # 1. mid-pass 2
        wait_until(run, "restart 1", lambda: coordinator.events("round_planned", round=1, kind="restart"))
        # 2. the same command in the same directory again: its files are those it was started with, so it is the
        # same host; it stands by, and the job moves back at checkpoint 2
        run.start(C)
        wait_until(run, "the move", lambda: coordinator.events("round_planned", round=2, kind="move"))
        assert run.hosts[C].events("host_round", part="stands_by") and not run.hosts[C].events("host_ended")
        wait_until(run, "checkpoint 3's save", marker.exists)
        run.kill(C)  # 3. while trainer 0 holds checkpoint 3 between the servers' save and its manifest
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in (A, B)}
        assert codes[A] == 0 and codes[B] == 0, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []
    console = consoles[A]

    # Both restarts and the move, in the job's event log: what was lost or came back, the old and new plans
    rounds = [(r["round"], r["kind"], r["lost"]) for r in run.hosts[A].events("round_planned")]
    assert rounds == [(1, "restart", [C]), (2, "move", []), (3, "restart", [C])], rounds
    planned = run.hosts[A].events("round_planned")
    assert (
        planned[0]["new_plan"]["stages"] == ["2 x cpu_small (4 layers)"] and len(planned[1]["new_plan"]["stages"]) == 2
    )
    assert [r["host"] for r in run.hosts[A].events("host_back")] == [C]
    # and on the console, as a user reads it
    assert re.search(rf"restart 1 \(1 left; round 1\): lost {re.escape(C)}; .* \| .* -> 2 x cpu_small \(", console)
    assert re.search(rf"host {re.escape(C)} is back and stands by", console), console[-4000:]
    with open(os.path.join(run.hosts[A].log_dir, "restarts.json")) as f:
        first, move, second = json.load(f)["restarts"]
    checkpoints = str(work / "checkpoints")
    assert first["kind"] == "restart" and first["lost"] == [C] and first["lost_so_far"] == [C]
    assert first["new_plan"]["stages"] == ["2 x cpu_small (4 layers)"] and first["passes_done"] == 1
    assert move["kind"] == "move" and move["lost"] == [] and move["lost_so_far"] == []
    assert len(move["new_plan"]["stages"]) == 2 and move["resumes_from"] == os.path.join(checkpoints, "pass-000002")
    assert second["kind"] == "restart" and second["lost"] == [C] and second["new_plan"]["predicted_samples_per_s"] > 0
    # killed during checkpoint 3: the job went on from checkpoint 2
    assert second["resumes_from"] == os.path.join(checkpoints, "pass-000002")
    assert marker.read_text().endswith(".pass-000003.incomplete")

    # Each round started from its checkpoint: the passes it holds skipped on every CPU trainer, the rest run.
    for address in (A, B):
        for round_number, skipped in ((1, 1), (2, 2), (3, 2)):
            text = worker_log(run, address, round_number)
            assert f"pass {skipped} skipped (train_from_dataset not run)" in text, (address, round_number)
            assert f"pass {skipped + 1} skipped" not in text, (address, round_number)
    with open(os.path.join(run.hosts[C].log_dir, "round2", "heterlog.0")) as f:
        assert "heterps:" in f.read()  # the host that came back ran the heterogeneous stage of round 2
    verify(os.path.join(checkpoints, "pass-000003"))  # the job's last checkpoint, written by round 3, is complete
    # Nothing lost: the job ends where the undisturbed one does, or above it.  Measured (disturbed - undisturbed):
    # +0.0083, +0.0079 (alone), +0.0041, +0.0034 (one suite run beside another), +0.0122, +0.0234 (three suites at once,
    # load average 20-46).  The gap is one-sided and grows with the load: the disturbed job runs part of its passes
    # one-stage, without the split's copies of the dense tables (refreshed from the servers every 20 ms), which go
    # staler the busier the machine.  A lost row or a redone pass would pull it down, which is what the lower bound (the 0.01)
    # guards; the upper bound allows the one-stage passes' gain (as tests/test_dropin_split.py does).
    # every host's inputs byte for byte what they were before the job: the job wrote its plan to heterps_plan/
    assert digests(run) == given
    assert all(os.path.isfile(os.path.join(run.host_dir(a), "heterps_plan", "plan.json")) for a in HOSTS)
    disturbed, calm = heldout(run), undisturbed
    print(f"\nheld-out AUC: disturbed {disturbed:.4f}, undisturbed {calm:.4f}")
    assert calm - 0.01 <= disturbed <= calm + 0.04, f"disturbed {disturbed:.4f} vs undisturbed {calm:.4f}"


ONE_STAGE = [{"resource": "cpu_small", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 2}]


def test_a_machine_never_in_the_hosts_file_joins_then_leaves_on_sigterm_without_a_restart(setup, undisturbed):
    """Elastic both ways: the job starts on the two CPU hosts of its hosts file (one stage); C, which no hosts file
    names, joins with its type and the job's key (``--join type=gpu_fast``) and the job moves to the split plan
    with it at the next checkpoint; then C's launch gets SIGTERM (a preemption notice): a checkpoint at the end of
    the running pass, a round without C from it, no restart used and no pass redone; all three end 0."""
    (setup["tmp"] / "one_stage.json").write_text(json.dumps({"format": 1, "feasible": True, "stages": ONE_STAGE}))
    # the notice's grace time well above a pass under any load: the leave waits for the checkpoint after it.
    # Incremental checkpoints, a base every 2: the split round (1) writes an increment on round 0's base, and the
    # round without C resumes from that chain, across two changes of plan.
    env = {"HETERPS_LEAVE_GRACE_S": "1200", "HETERPS_CHECKPOINT_BASE_EVERY": "2"}
    # C first: it waits for the coordinator, and joins before checkpoint 1 whatever the load
    join = (C, ("--join", f"type=gpu_fast,port={free_port_block(C, 8)}"))
    run, work = run_job(setup, "elastic", env, listed=(A, B), plan=str(setup["tmp"] / "one_stage.json"), first=[join])
    try:
        coordinator, joiner = run.hosts[A], run.hosts[C]
        wait_until(run, "C joined", lambda: coordinator.events("host_back", host=C))
        wait_until(run, "the move", lambda: coordinator.events("round_planned", round=1, kind="move"))
        wait_until(
            run, "C's heterogeneous stage", lambda: os.path.exists(os.path.join(joiner.log_dir, "round1", "heterlog.0"))
        )
        newest_at_notice = max([p for p in range(1, 4) if complete(work, p)], default=0)
        joiner.proc.send_signal(signal.SIGTERM)
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in HOSTS}
        assert codes == {a: 0 for a in HOSTS}, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []
    console = consoles[A]
    assert [r["how"] for r in run.hosts[C].events("host_ended")] == ["left"], consoles[C][-3000:]
    assert "this host left the job" in consoles[C], consoles[C][-3000:]  # as its user reads it
    (joined,) = run.hosts[A].events("host_back", host=C)
    assert joined["joined"]["type"] == "gpu_fast" and joined["moves"] is True
    assert run.hosts[A].events("leave_asked", host=C)
    (left,) = run.hosts[A].events("round_planned", kind="leave")
    assert left["round"] == 2 and re.search(r"the job goes on from the checkpoint of \d+ passes", left["why"]), left
    assert re.search(
        rf"host {re.escape(C)} asks to leave: a checkpoint at the end of the running pass or slice", console
    )
    with open(os.path.join(run.hosts[A].log_dir, "restarts.json")) as f:
        move, leave = json.load(f)["restarts"]
    assert move["kind"] == "move" and move["joined"] == [
        {"address": C, "type": "gpu_fast", "units": 1, "port": move["joined"][0]["port"]}
    ]
    assert move["old_plan"]["stages"] == ["2 x cpu_small (4 layers)"] and len(move["new_plan"]["stages"]) == 2
    assert C in move["hosts"] and move["passes_done"] == 1
    assert leave["kind"] == "leave" and leave["left"] == [C] and leave["lost"] == [] and C not in leave["hosts"]
    # nothing redone: the round without C resumes from a checkpoint written after the notice
    assert leave["passes_done"] > newest_at_notice, (leave, newest_at_notice)
    for address in (A, B):
        for round_number, skipped in ((1, 1), (2, leave["passes_done"])):
            text = worker_log(run, address, round_number)
            assert f"pass {skipped} skipped (train_from_dataset not run)" in text, (address, round_number)
            assert f"pass {skipped + 1} skipped" not in text, (address, round_number)
    assert not os.path.exists(os.path.join(run.hosts[C].log_dir, "round2"))  # C ran nothing after it left
    # the round without C resumed from an increment the split round wrote on the one-stage round's base
    resumed = read_manifest(leave["resumes_from"])["launch"]
    assert resumed["kind"] == "incremental" and [link["name"] for link in resumed["chain"]] == ["pass-000001"]
    # the hosts file on disk is not edited: what the job ran on is in restarts.json
    assert all(C not in open(run.host_files(a)[0]).read() for a in HOSTS)
    grown, calm = heldout(run), undisturbed
    print(f"\nheld-out AUC: grown and shrunk {grown:.4f}, undisturbed {calm:.4f}")
    # the issue's 0.02 below; above, the one-stage passes' gain under load (the test above says why)
    assert calm - 0.02 <= grown <= calm + 0.04, f"grown and shrunk {grown:.4f} vs undisturbed {calm:.4f}"


# The scenario heterps bench adapt measures (one home): the cluster file overstates the heterogeneous type and
# understates the CPU type, so on its word the split is by far the best plan.  Here without a target (rule e).
OVERSTATED, LOCAL_SPLIT = bench_adapt.cluster_text(None), bench_adapt.SPLIT
# The other adaptive tests' windows, short enough that a pass holds a decision (the same rules, other times); each
# job stands for one that runs on for an hour: a move for speed alone must win back its own time over the horizon
ADAPT_ENV = {
    "HETERPS_METER_S": "1",
    "HETERPS_RATES_WINDOW_S": "9",
    "HETERPS_ADAPT_SUSTAIN_S": "10",
    "HETERPS_ADAPT_EVERY_S": "5",
    "HETERPS_ADAPT_HORIZON_S": "3600",
}


def test_at_default_settings_a_split_measured_before_betting_moves_on_cost_per_sample_and_releases(setup):
    """The plan follows the job at default settings (issue 54): the launch runs the split the file favours; each
    host type is timed on its host first; with no target (rule e) the job moves at a checkpoint to one stage on the
    CPU hosts (the plan decided runs), releases the heterogeneous host, and its cost per million samples falls.  8
    passes: at defaults a decision needs minutes of windows, and the move must pay back its 60 s."""
    (setup["tmp"] / "overstated").mkdir()
    (setup["tmp"] / "overstated" / "cluster.yaml").write_text(OVERSTATED)  # each host's cluster.yaml
    (setup["tmp"] / "local_split.json").write_text(json.dumps({"format": 1, "feasible": True, "stages": LOCAL_SPLIT}))
    run, work = run_job(
        setup,
        "adaptive",
        plan=str(setup["tmp"] / "local_split.json"),
        cluster=str(setup["tmp"] / "overstated" / "cluster.yaml"),
        options=("--adapt", "on"),
        epochs=8,
    )
    try:
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in HOSTS}
        assert codes == {a: 0 for a in HOSTS}, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []
    coordinator = run.hosts[A]
    measured = {r["resource"]: r for r in coordinator.events("measured")}
    assert measured["gpu_fast"]["host"] == C and measured["gpu_fast"]["seconds_per_sample"] > 0, measured
    # the file said gpu_fast runs the program hundreds of times faster than it does here: measured, not believed
    assert measured["gpu_fast"]["seconds_per_sample"] > 10 * measured["gpu_fast"]["file_seconds_per_sample"]
    (decided,) = coordinator.events("adapt", decision="move")
    assert "trains a sample for" in decided["why"] and "no target or budget" in decided["why"], decided["why"]
    (moved,) = coordinator.events("round_planned", kind="adapt")
    assert moved["round"] == 1 and C in moved["released"], moved
    new_stages = moved["new_plan"]["stages"]
    assert len(new_stages) == 1 and "cpu_small (4 layers)" in new_stages[0], new_stages
    # the plan decided is the plan that runs: the new round's trainer 0 published that plan's stages
    assert decided["proposal"]["plan"]["stages"][0]["layers"] == ["embedding_0", "fc_0", "fc_1", "fc_2"]
    worker = worker_log(run, A, 1)
    assert "the cut of the plan the launch was started for: embedding_0, fc_0, fc_1, fc_2" in worker
    assert [r["how"] for r in run.hosts[C].events("host_ended")] == ["released"]
    assert "released: the plan no longer needs it" in consoles[C]
    # the measured cost per million samples of each round, its first costed window to its last: lower after the move
    last = {}
    for number in (0, 1):
        costed = [r for r in coordinator.events("rates", round=number) if r["cost_so_far"] is not None]
        cost, samples = (
            costed[-1]["cost_so_far"] - costed[0]["cost_so_far"],
            costed[-1]["samples"] - costed[0]["samples"],
        )
        last[number] = cost_per_million_of(cost, samples)
    assert last[1] < last[0], last
    grown = heldout(run)
    print(f"\ncost per million samples: split {last[0]:.4g}, moved {last[1]:.4g}; held-out AUC {grown:.4f}")
    # It learned: finite, never NOT LEARNING, well above chance; not against the 3-pass undisturbed job: 8 passes of
    # the same rows overfit (a fresh clone's run: pass AUC 0.9996 at the end, held-out 0.699 against 0.757)
    learned = [r["learning"] for r in coordinator.events("rates") if r.get("learning")]
    assert learned and all(x["finite"] is not False and not x["verdict"] for x in learned), learned
    assert grown >= 0.62, grown


# A steady job (issue 41, test iii): one stage on the two CPU hosts, its target 0.75 of what the same job measured
# undisturbed just before.  Every trainer is stopped for a random share of each second, up to JITTER: its rates are
# 20% lower on average and vary from window to window.  Neither the noise nor the refit of noisy windows may move it
# or ask for a machine.  One unit (half the price) is a real saving on 2 cores: the saving margin is set above 50%.
STEADY = [{"resource": "cpu_small", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 2}]
STEADY_TARGET = 0.75
JITTER = 0.4


def jitter(run, hosts, seed=41):
    """Each second every CPU trainer of ``hosts`` stopped for a random share of it, 0 to JITTER."""
    rng = random.Random(seed)
    return Slowing(run, hosts, lambda: rng.uniform(0.0, JITTER))


def measured_rate(host):
    """The median samples/s of a job's windows that trained (its coordinator's rates records, round 0)."""
    rates = [r["samples_per_s"] for r in host.events("rates", round=0) if r["samples_per_s"] > 0]
    assert rates, "the job measured no window that trained"
    return statistics.median(rates)


@pytest.fixture(scope="module")
def steady(setup):
    """The steady job (one stage on A and B) undisturbed, --adapt off: its measured samples/s, its held-out AUC, the
    plan, and a cluster file whose target is STEADY_TARGET of that rate (tests ii and iii start from it)."""
    (setup["tmp"] / "steady.json").write_text(json.dumps({"format": 1, "feasible": True, "stages": STEADY}))
    plan = str(setup["tmp"] / "steady.json")
    calm_run, _ = run_job(setup, "steady_calm", ADAPT_ENV, listed=(A, B), plan=plan, options=("--adapt", "off"))
    try:
        assert calm_run.wait() == {A: 0, B: 0}, calm_run.hosts[A].console()[-4000:]
    finally:
        calm_run.stop()
    assert calm_run.leftovers() == []
    calm = measured_rate(calm_run.hosts[A])
    (setup["tmp"] / "steady").mkdir()
    cluster = setup["tmp"] / "steady" / "cluster.yaml"
    cluster.write_text(split_cluster(cpu_units=2, gpu_units=1, throughput=STEADY_TARGET * calm))
    return {"rate": calm, "auc": heldout(calm_run), "plan": plan, "cluster": str(cluster)}


def test_a_steady_job_whose_rates_jitter_never_moves(setup, steady):
    calm, plan, cluster = steady["rate"], steady["plan"], steady["cluster"]
    env = {**ADAPT_ENV, "HETERPS_ADAPT_SAVING": "0.6"}
    run, _ = run_job(setup, "steady_jitter", env, listed=(A, B), plan=plan, cluster=cluster, options=("--adapt", "on"))
    noise = jitter(run, (A, B)).start()
    try:
        codes = run.wait()
    finally:
        noise.stop()
        run.stop()
    stops = noise.stops
    coordinator = run.hosts[A]
    assert codes == {A: 0, B: 0}, coordinator.console()[-4000:]
    assert run.leftovers() == []
    jittered = [r["samples_per_s"] for r in coordinator.events("rates", round=0) if r["samples_per_s"] > 0]
    looked = coordinator.events("reconsidering")
    print(
        f"\nsteady job: calm {calm:,.0f} samples/s, target {STEADY_TARGET * calm:,.0f}; jittered windows "
        f"{min(jittered):,.0f}-{max(jittered):,.0f} (median {statistics.median(jittered):,.0f}); "
        f"{len(looked)} reconsiderations, decisions {[d['decision'] for d in coordinator.events('adapt')]}; "
        f"{sum(n == 2 for n in stops)} of {len(stops)} seconds with both trainers stopped a while"
    )
    running = [n for n in stops if n]  # the seconds its trainers ran (none while they start, or after the end)
    assert running and sum(n == 2 for n in running) >= len(running) // 2, stops  # the noise reached the trainers
    assert looked, "the job never looked for another plan: nothing was tested"
    assert coordinator.events("adapt", decision="move") == [] and coordinator.events("round_planned") == []
    # nor a machine asked for on noise (a paid VM): no host replaced, no units wished for, --on-scale never run
    assert [d["decision"] for d in coordinator.events("adapt") if d["decision"] in ("replace", "wish")] == []
    assert coordinator.events("on_scale") == [] and coordinator.events("on_scale_ran") == []
    assert [r["round"] for r in coordinator.events("round_started")] == [0]
    grown, calm_auc = heldout(run), steady["auc"]
    assert abs(grown - calm_auc) <= 0.02, (grown, calm_auc)


# A host slowed mid-job (issue 41, test ii): the steady job, its target 0.75 of its calm rate, B's trainers stopped
# SLOWED_SHARE of every second from its first measured window on.  Each trainer reads its own share of the files: B
# bounds every pass, and the job falls far under its target.  The job names B slow, asks --on-scale for a unit of
# its type (the test's command records what is asked; the test, as a cloud would, starts a machine on C with the
# --join command), moves onto C at the next checkpoint and releases B (ends 0); on A and C it meets its target again.
# The share and the windows are heterps bench adapt's scenario (ii)'s (it says why).
SLOWED_SHARE = bench_adapt.SLOWED_SHARE
SLOWED_ENV = {**ADAPT_ENV, **bench_adapt.SLOWED_SETTINGS}


def test_a_host_slowed_mid_job_is_replaced_by_a_machine_asked_of_on_scale(setup, steady):
    calm, target = steady["rate"], STEADY_TARGET * steady["rate"]
    wish = setup["tmp"] / "slowed_on_scale.json"
    asks = f"cat > {wish}.part && mv {wish}.part {wish}"
    options = ("--adapt", "on", "--on-scale", asks)
    run, _ = run_job(
        setup, "slowed", SLOWED_ENV, listed=(A, B), plan=steady["plan"], cluster=steady["cluster"], options=options
    )
    coordinator = run.hosts[A]
    slowing = Slowing(run, (B,), lambda: SLOWED_SHARE)
    try:
        wait_until(run, "a measured window", lambda: [r for r in coordinator.events("rates") if r["samples_per_s"]])
        slowing.start()
        wait_until(run, "the job asking --on-scale for a machine", wish.exists)
        asked_at = time.time()
        run.start(C, options=("--join", f"type=cpu_small,port={free_port_block(C, 8)}"))
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in HOSTS}
        assert codes == {A: 0, B: 0, C: 0}, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        slowing.stop()
        run.stop()
    assert run.leftovers() == []
    slowed_at = slowing.started_at
    asked = json.loads(wish.read_text())
    assert len(coordinator.events("on_scale")) == 1, coordinator.events("on_scale")  # one wish: the replacement
    assert asked["wanted"] == {"cpu_small": 1} and asked["released"] == {}, asked
    assert f"host {B} is slow" in asked["why"], asked
    (decided,) = coordinator.events("adapt", decision="replace")
    assert decided["replace"]["host"] == B and decided["replace"]["share_of_peers"] < 0.6, decided
    (moved,) = coordinator.events("round_planned", kind="adapt")
    assert moved["round"] == 1 and moved["released"] == [B] and moved["hosts"] == [A, C], moved
    assert moved["new_plan"]["stages"] == ["2 x cpu_small (4 layers)"], moved
    assert [r["how"] for r in run.hosts[B].events("host_ended")] == ["released"]
    assert "released: the plan no longer needs it" in consoles[B]
    # under the target while B was slow (the windows from the slowing to the end of round 0: B's passes), at it
    # again on A and C (round 1's, its first window that trained to its last): the windows' mean, the checkpoints'
    # included, as the machine judges it (a window sees a pass's burst or its tail, the mean sees the passes)
    slowed = bench_adapt.windows_mean(coordinator.events("rates", round=0), since=slowed_at)
    after = bench_adapt.windows_mean(coordinator.events("rates", round=1))
    print(
        f"\nslowed host: calm {calm:,.0f} samples/s, target {target:,.0f}; slowed {slowed:,.0f}; decided "
        f"{decided['t'] - slowed_at:.1f} s after the slowing began; asked {asked_at - slowed_at:.1f} s after; on A "
        f"and C {after:,.0f}"
    )
    # the job fell under its target (the machine acted on its miss by more than HETERPS_ADAPT_MISS, on its own
    # windows: the decision says so) and meets it again
    assert slowed < target <= after and "missed its target" in decided["why"], (slowed, after, target)
    assert sum(n == 1 for n in slowing.stops) >= 3, slowing.stops  # the slowing reached B's trainer
    grown = heldout(run)
    assert abs(grown - steady["auc"]) <= 0.02, (grown, steady["auc"])


# A leave on notice in the middle of a long pass (issue 44, item 3): the steady job, each pass cut in 4 slices of
# its files (each trainer reads 4 of the 8 files: a file a slice).  Every trainer waits before the second slice of
# pass 2 (tests/faults/sitecustomize.py) until the test has SIGTERMed B and B's leave has asked for a checkpoint:
# the notice comes while a slice is to run, long before the pass's end.  The checkpoint comes at that slice's end
# (pass-000001.2of4); the trainers train no further (the round ends at it); the round without B trains the files
# of pass 2 not done, then pass 3.  tests/faults/sitecustomize.py records the files every train_from_dataset trained.
SLICES = 4


def test_a_leave_on_notice_inside_a_pass_redoes_no_slice(setup, steady):
    work_trained = setup["tmp"] / "leave_inside_trained"
    work_trained.mkdir()
    go = setup["tmp"] / "leave_inside_go"
    env = {
        "HETERPS_LEAVE_GRACE_S": "1200",
        "HETERPS_CHECKPOINT_SLICES": str(SLICES),
        "HETERPS_TEST_TRAINED_DIR": str(work_trained),
        "HETERPS_TEST_WAIT_PASS": "2",
        "HETERPS_TEST_WAIT_FOR": str(go),
        "PYTHONPATH": os.pathsep.join(filter(None, [FAULTS, os.environ.get("PYTHONPATH")])),
    }
    run, work = run_job(setup, "leave_inside", env, listed=(A, B), plan=steady["plan"])
    try:
        # both trainers past their meeting after pass 2's first slice (so the ask is read at the second's end)
        wait_until(run, "pass 2's first slice", lambda: len(list(work_trained.glob("waiting-*"))) == 2)
        run.hosts[B].proc.send_signal(signal.SIGTERM)
        wait_until(run, "the ask for a checkpoint", lambda: list((work / "checkpoints" / ".sync").glob("*/asked")))
        go.write_text("go")
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in (A, B)}
        assert codes == {A: 0, B: 0}, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []
    assert [r["how"] for r in run.hosts[B].events("host_ended")] == ["left"], consoles[B][-3000:]
    (left,) = run.hosts[A].events("round_planned", kind="leave")
    assert "the job goes on from the checkpoint of 1.5 passes, nothing redone" in left["why"], left
    with open(os.path.join(run.hosts[A].log_dir, "restarts.json")) as f:
        (leave,) = json.load(f)["restarts"]
    assert os.path.basename(leave["resumes_from"]) == "pass-000001.2of4" and leave["passes_done"] == 1.5, leave
    # every file of every pass trained exactly once, across the trainers and the rounds: the undisturbed job's
    # samples, none twice (pass 2's first half before the leave, on A and B; its second half after, on A alone)
    records = trained(work_trained)
    every = sorted(f for r in records if r["pass"] == 1 for f in r["files"])
    assert len(every) == len(set(every)) == 8, every
    samples = {}
    for number in (1, 2, 3):
        files = sorted(f for r in records if r["pass"] == number for f in r["files"])
        assert files == every, (number, files)
        samples[number] = sum(count_lines(f) for f in files)
    # pass 2: two slices on each host before the leave (round 0), the other four files after it, on A (round 1)
    (first_round,) = {r["launch"] for r in records if r["pass"] == 1}  # (records[0]'s: files sort by pid as text)
    before = [f for r in records if r["pass"] == 2 and r["launch"] == first_round for f in r["files"]]
    after = [r for r in records if r["pass"] == 2 and r["launch"] != first_round]
    assert len(before) == 4 and {r["host"] for r in after} == {A} and len({r["launch"] for r in after}) == 1, records
    assert samples[2] == samples[1] == samples[3], samples
    with open(os.path.join(setup["data"], "meta.json")) as f:
        assert samples[1] == json.load(f)["train_rows"]
    log = worker_log(run, A, 1)
    assert "pass 1 skipped (train_from_dataset not run)" in log, log[-3000:]
    assert re.search(r"pass 2 goes on from \S+/pass-000001\.2of4: [1-4] of its [2-8] files here trained already", log)
    grown = heldout(run)
    print(f"\nleave inside a pass: samples a pass {samples}; held-out AUC {grown:.4f}, undisturbed {steady['auc']:.4f}")
    # The 0.02 is what this job meets against the calm job's mean: here the job after the leave (one trainer
    # for the last pass and a half) came out 0.770-0.773 in 5 runs, while the calm job (two trainers pushing
    # asynchronously) spread 0.772-0.798 over 6 runs by itself; against one calm run, the bound holds that spread too
    assert abs(grown - steady["auc"]) <= 0.03, (grown, steady["auc"])


def trained(directory):
    """What every stage 1 CPU trainer's train_from_dataset runs trained (tests/faults/sitecustomize.py)."""
    records = []
    for path in sorted(directory.glob("trained-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)
