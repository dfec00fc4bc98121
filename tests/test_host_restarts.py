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

The same three hosts also run a machine that joins and leaves, and the adaptive jobs whose cluster file overstates
the heterogeneous type: at default settings with no target (rule e), and under a budget (rule c).  The steady job
on two of them is tests/test_launched_steady_job.py's; the harness is tests/launched_jobs.py.
"""

import json
import os
import re
import signal

import pytest
from launched_jobs import (
    ADAPT_ENV,
    FAULTS,
    HOSTS,
    ONE_STAGE,
    A,
    B,
    C,
    complete,
    digests,
    heldout,
    launched_setup,
    round_costs,
    run_job,
    wait_until,
    worker_log,
)

from heterps_paddle.runtime.checkpoint_files import verify
from heterps_paddle.tools.bench import adapt as bench_adapt
from heterps_paddle.tools.jobs import free_port_block

pytestmark = pytest.mark.launched


@pytest.fixture(scope="module")
def setup(tmp_path_factory, heterps_cache, data_100k):
    return launched_setup(tmp_path_factory, data_100k, "restarts")


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
    # the move asks for a checkpoint once C is back: between two shards of pass 2 (docs/data-plan.md), or at its end
    # when the ask came with every shard handed out
    moved_from = os.path.relpath(move["resumes_from"], checkpoints)
    assert moved_from == "pass-000002" or re.fullmatch(r"pass-000001\.\d+of\d+", moved_from), move
    assert len(move["new_plan"]["stages"]) == 2
    assert second["kind"] == "restart" and second["lost"] == [C] and second["new_plan"]["predicted_samples_per_s"] > 0
    # killed during checkpoint 3: the job went on from checkpoint 2
    assert second["resumes_from"] == os.path.join(checkpoints, "pass-000002")
    assert marker.read_text().endswith(".pass-000003.incomplete")

    # Each round started from its checkpoint: the passes it holds skipped on every CPU trainer, the rest run.
    for address in (A, B):
        for round_number, skipped in ((1, 1), (2, int(move["passes_done"])), (3, 2)):
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
    assert left["round"] == 2 and re.search(r"the job goes on from the checkpoint of [\d.]+ passes", left["why"]), left
    assert re.search(
        rf"host {re.escape(C)} asks to leave: a checkpoint once the trainers have trained the shards in hand", console
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
        # whole passes skipped; a checkpoint inside a pass (the leave's, between two shards) goes on in the next
        for round_number, skipped in ((1, 1), (2, int(leave["passes_done"]))):
            text = worker_log(run, address, round_number)
            assert f"pass {skipped} skipped (train_from_dataset not run)" in text, (address, round_number)
            assert f"pass {skipped + 1} skipped" not in text, (address, round_number)
    assert not os.path.exists(os.path.join(run.hosts[C].log_dir, "round2"))  # C ran nothing after it left
    # the round without C resumed from an increment the split round wrote on the one-stage round's base (its
    # server says so: a leave between two shards, pass-000001.KofS, is no longer kept once two later ones are)
    with open(os.path.join(run.hosts[A].log_dir, "round2", "serverlog.0")) as f:
        chain = (
            f"sparse tables loaded from its chain, base first: pass-000001 + {os.path.basename(leave['resumes_from'])}"
        )
        assert chain in f.read(), chain
    # the hosts file on disk is not edited: what the job ran on is in restarts.json
    assert all(C not in open(run.host_files(a)[0]).read() for a in HOSTS)
    grown, calm = heldout(run), undisturbed
    print(f"\nheld-out AUC: grown and shrunk {grown:.4f}, undisturbed {calm:.4f}")
    # the issue's 0.02 below; above, the one-stage passes' gain under load (the test above says why)
    assert calm - 0.02 <= grown <= calm + 0.04, f"grown and shrunk {grown:.4f} vs undisturbed {calm:.4f}"


# The scenario heterps bench adapt measures (one home): the cluster file overstates the heterogeneous type and
# understates the CPU type, so on its word the split is by far the best plan.  Here without a target (rule e).
OVERSTATED, LOCAL_SPLIT = bench_adapt.cluster_text(None), bench_adapt.SPLIT


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
    last = round_costs(coordinator)
    assert last[1] < last[0], last
    grown = heldout(run)
    print(f"\ncost per million samples: split {last[0]:.4g}, moved {last[1]:.4g}; held-out AUC {grown:.4f}")
    # It learned: finite, never NOT LEARNING, well above chance; not against the 3-pass undisturbed job: 8 passes of
    # the same rows overfit (a fresh clone's run: pass AUC 0.9996 at the end, held-out 0.699 against 0.757)
    learned = [r["learning"] for r in coordinator.events("rates") if r.get("learning")]
    assert learned and all(x["finite"] is not False and not x["verdict"] for x in learned), learned
    assert grown >= 0.62, grown


def test_under_a_budget_a_split_measured_slow_moves_to_the_fastest_plan_within_it(setup):
    """Rule (c) in a launched job (issue 54): the scenario above with a budget of the split's own price an hour (4:
    two cpu_small at 1, one gpu_fast at 2) and no target, at the other adaptive tests' shortened windows.  On the
    file's word the split is the fastest plan within it; measured, the heterogeneous stage (a CPU process here) is
    hundreds of times slower than the file says, and one stage on the two CPU hosts is the fastest within the budget:
    the job moves to it at a checkpoint, releases C, and trains a sample for less."""
    (setup["tmp"] / "budget_cluster").mkdir()
    (setup["tmp"] / "budget_cluster" / "cluster.yaml").write_text(OVERSTATED)
    (setup["tmp"] / "budget_split.json").write_text(json.dumps({"format": 1, "feasible": True, "stages": LOCAL_SPLIT}))
    run, _ = run_job(
        setup,
        "budget",
        ADAPT_ENV,
        plan=str(setup["tmp"] / "budget_split.json"),
        cluster=str(setup["tmp"] / "budget_cluster" / "cluster.yaml"),
        options=("--adapt", "on"),
        script_options=("--budget", "4"),
    )
    try:
        codes = run.wait()
        consoles = {a: run.hosts[a].console() for a in HOSTS}
        assert codes == {a: 0 for a in HOSTS}, "\n".join(c[-4000:] for c in consoles.values())
    finally:
        run.stop()
    assert run.leftovers() == []
    coordinator = run.hosts[A]
    (decided,) = coordinator.events("adapt", decision="move")
    assert "faster within the budget of 4/h" in decided["why"], decided["why"]
    assert decided["proposal"]["budget"] == 4 and decided["proposal"]["cost_per_hour"] <= 4, decided["proposal"]
    (moved,) = coordinator.events("round_planned", kind="adapt")
    assert C in moved["released"] and len(moved["new_plan"]["stages"]) == 1, moved
    assert [r["how"] for r in run.hosts[C].events("host_ended")] == ["released"]
    per_million = round_costs(coordinator)
    print(f"\nunder a budget: cost per million samples by round {per_million}; decided: {decided['why']}")
    assert per_million[moved["round"]] < per_million[0], per_million
