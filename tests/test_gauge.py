"""The launch's gauge (launch/gauge.py) on canned meter records: a stage's measured rate and work share over the
window, the job's cost per hour, cost so far and cost per million samples (the one definition), rounds, and
records it cannot read.  Pure: times are given."""

import pytest

from heterps_paddle.launch.gauge import Gauge
from heterps_paddle.planning.unit_cost import cost_per_million_samples

PLAN = {
    "plan": {
        "throughput": 900.0,
        "required_throughput": 800.0,
        "stages": [
            {"resource": "cpu_small", "kind": "cpu", "units": 2, "throughput": 950.0},
            {"resource": "gpu_fast", "kind": "gpu", "units": 1, "throughput": 900.0},
        ],
    },
    "prices": {"cpu_small": 1.0, "gpu_fast": 2.0},
}


def meters(samples, cpu):
    """Two stage 1 trainers (two cores each) with ``samples`` each and ``cpu`` CPU seconds each; one heter."""
    records = {
        f"meter.1.trainer.{i}": {
            "stage": 1,
            "role": "trainer",
            "index": i,
            "cpu_s": cpu,
            "cores": 2,
            "samples": samples,
        }
        for i in range(2)
    }
    records["meter.2.heter.0"] = {
        "stage": 2,
        "role": "heter",
        "index": 0,
        "cpu_s": cpu * 2,
        "cores": 1,
        "samples": None,
    }
    return records


def test_rates_over_the_window_work_shares_and_one_cost_definition():
    gauge = Gauge(window_s=30.0, every_s=10.0)
    assert gauge.observe(1000.0, 0, meters(0, 0.0), PLAN) is None  # one snapshot: nothing to measure over
    assert gauge.observe(1005.0, 0, meters(2500, 5.0), PLAN) is None  # not due yet
    rates = gauge.observe(1010.0, 0, meters(5000, 10.0), PLAN)
    assert rates is not None and rates.samples == 10000
    assert rates.samples_per_s == pytest.approx(1000.0)  # 2 x 5000 samples in 10 s
    assert rates.cost_per_hour == 4.0  # 2 x 1.0 + 1 x 2.0
    assert rates.cost_so_far == pytest.approx(4.0 * 10 / 3600)
    assert rates.cost_per_million_samples == pytest.approx(cost_per_million_samples(4.0, 1000.0))
    one, two = rates.stages
    assert one.work_share == pytest.approx(20.0 / (10.0 * 4))  # 2 trainers x 10 CPU s over 10 s x 4 cores
    assert one.capacity_samples_per_s == pytest.approx(1000.0 / 0.5) and one.waiting_for == "next"
    assert two.work_share == pytest.approx(1.0)  # 20 CPU s over 10 s x 1 core: at most 1
    assert two.waiting_for == "previous" and two.predicted_samples_per_s == 900.0 and one.price_per_hour == 1.0
    record = rates.to_record()
    assert record["stages"][0]["wait_share"] == pytest.approx(0.5) and record["target_samples_per_s"] == 800.0
    assert any("job (round 0): 1,000 samples/s" in line for line in rates.lines())


def test_a_gpu_stage_on_its_device_has_no_cpu_work_share_and_the_window_moves():
    gauge = Gauge(window_s=10.0, every_s=1.0, gpu_stages=frozenset({2}))
    for t in range(0, 41, 5):
        rates = gauge.observe(1000.0 + t, 0, meters(100 * t if t <= 20 else 2000, float(t)), PLAN)
    assert rates.stages[1].work_share is None and rates.stages[1].capacity_samples_per_s is None
    assert rates.samples_per_s == 0.0  # the last 10 s trained nothing: the window forgets the start
    assert rates.cost_per_million_samples is None


def test_rounds_add_up_their_samples_and_cost_and_garbage_is_not_counted():
    gauge = Gauge(window_s=30.0, every_s=0.0)
    gauge.observe(0.0, 0, meters(0, 0.0), PLAN)
    gauge.observe(3600.0, 0, meters(1000, 1.0), PLAN)  # an hour of round 0 at 4/h
    gauge.observe(3600.0, 1, {"meter.x": {"stage": "?"}, "meter.y": "garbage"}, None)  # round 1: no plan yet
    rates = gauge.observe(3610.0, 1, {**meters(50, 1.0), "meter.z": {"cpu_s": 1}}, {**PLAN, "prices": {}})
    assert rates.round == 1 and rates.samples == 2000 + 100  # the rounds' samples together
    assert rates.cost_per_hour is None and rates.cost_so_far is None  # no prices: no cost, never a wrong one
    assert gauge.cost_so_far == pytest.approx(4.0)


def test_a_plan_published_after_the_round_started_is_priced_at_once_not_an_interval_later():
    gauge = Gauge(window_s=30.0, every_s=10.0)
    gauge.observe(1000.0, 0, meters(0, 0.0), None)
    first = gauge.observe(1010.0, 0, meters(1000, 1.0), None)
    assert first is not None and first.cost_so_far is None  # no plan yet: the time waits to be priced
    assert gauge.observe(1012.0, 0, meters(1200, 1.2), None) is None  # not due
    priced = gauge.observe(1013.0, 0, meters(1300, 1.3), PLAN)  # trainer 0 published its plan
    assert priced is not None and priced.cost_so_far == pytest.approx(4.0 * 13 / 3600)  # paid from the start
    assert gauge.observe(1014.0, 0, meters(1400, 1.4), PLAN) is None  # then every interval again


def test_figures_over_the_job_and_the_round_are_cost_over_samples_and_no_round_resets_them():
    """Issue 53: the cost per million samples over the job is what it cost so far over what it trained (one function
    for every span); a new round starts its own figures and leaves the job's going on; an idle last window says
    nothing of what the job cost."""
    gauge = Gauge(window_s=30.0, every_s=0.0)
    gauge.observe(0.0, 0, meters(0, 0.0), PLAN)
    first = gauge.observe(1800.0, 0, meters(9000, 1.0), PLAN)  # half an hour at 4/h, 18,000 samples
    assert first.cost_so_far == pytest.approx(2.0) and first.samples == 18000
    assert first.cost_per_million_samples_over_job == pytest.approx(2.0 / 18000 * 1e6)
    assert first.samples_per_s_over_job == pytest.approx(10.0) and first.seconds_over_job == pytest.approx(1800.0)
    # round 1 (a move) on another plan at 2/h
    cheaper = {**PLAN, "plan": {**PLAN["plan"], "stages": [{"resource": "cpu_small", "kind": "cpu", "units": 2}]}}
    gauge.observe(1800.0, 1, meters(0, 0.0), cheaper)
    later = gauge.observe(3600.0, 1, meters(3000, 1.0), cheaper)  # half an hour at 2/h, 6,000 samples
    assert later.round == 1 and later.samples == 24000 and later.cost_so_far == pytest.approx(3.0)
    assert later.cost_per_million_samples_over_job == pytest.approx(3.0 / 24000 * 1e6)
    assert later.samples_over_round == 6000 and later.cost_over_round == pytest.approx(1.0)
    assert later.cost_per_million_samples_over_round == pytest.approx(1.0 / 6000 * 1e6)
    assert later.seconds_over_round == pytest.approx(1800.0) and later.seconds_over_job == pytest.approx(3600.0)
    record = later.to_record()
    assert record["cost_per_million_samples_over_job"] == pytest.approx(125.0)
    assert record["samples_per_s_over_round"] == pytest.approx(6000 / 1800, abs=1e-3)
    line = later.lines()[-1]
    assert line == (
        "heterps launch: over the job: 24,000 samples in 3,600 s, 7 samples/s; cost 3, 125 per million samples "
        "(round 1: 6,000 samples in 1,800 s, 166.7 per million samples)"
    )
    # the job idles (a checkpoint, the end): the last window trains nothing, the job's figures stand
    idle = gauge.observe(3700.0, 1, meters(3000, 1.0), cheaper)
    assert idle.samples_per_s == 0.0 and idle.cost_per_million_samples is None
    assert idle.cost_per_million_samples_over_job == pytest.approx(idle.cost_so_far / 24000 * 1e6)


def trainers(progress):
    """Stage 1 trainers on hosts 127.0.0.2, .3, ...: ``progress`` gives each one's (samples, finished passes)."""
    return {
        f"meter.1.trainer.{i}": {
            "stage": 1,
            "role": "trainer",
            "index": i,
            "host": f"127.0.0.{i + 2}",
            "cpu_s": 1.0,
            "cores": 1,
            "samples": samples,
            "passes": passes,
        }
        for i, (samples, passes) in enumerate(progress)
    }


def window(gauge, start, end, at=1000.0):
    """Two snapshots 10 s apart (the gauge's first window): the trainers at ``start`` and at ``end``."""
    assert gauge.observe(at, 0, trainers(start), None) is None
    rates = gauge.observe(at + 10.0, 0, trainers(end), None)
    assert rates is not None
    return rates


def test_a_trainer_slower_than_its_peers_in_the_same_pass_is_named_with_its_host():
    """Each host's trainer against its peers in the same pass: one at a third of their rate is slow, named on the
    console with its host; the others are not, and none is when the rates are close."""
    rates = window(Gauge(window_s=30.0, every_s=10.0), [(0, 0)] * 3, [(10000, 0), (3000, 0), (9000, 0)])
    fast, slow, other = rates.trainers
    assert (slow.host, slow.index, slow.slow) == ("127.0.0.3", 1, True)
    assert slow.samples_per_s == pytest.approx(300.0) and slow.peers_samples_per_s == pytest.approx(950.0)
    assert not fast.slow and not other.slow
    assert rates.to_record()["trainers"][1] == {
        "host": "127.0.0.3",
        "index": 1,
        "samples_per_s": 300.0,
        "peers_samples_per_s": 950.0,
        "share_of_peers": 0.316,
        "slow": True,
    }
    (line,) = [text for text in rates.lines() if "127.0.0.3" in text]
    assert line.startswith("heterps launch: host 127.0.0.3 (trainer 1): 300 samples/s, 32% of its peers'")
    calm = window(Gauge(window_s=30.0, every_s=10.0), [(0, 0)] * 3, [(10000, 0), (7000, 0), (9000, 0)])
    assert not any(t.slow for t in calm.trainers) and not any("host 127.0.0" in text for text in calm.lines())
    assert [
        t.slow for t in window(Gauge(straggler_share=0.8), [(0, 0)] * 3, [(10000, 0), (7000, 0), (9000, 0)]).trainers
    ] == [
        False,
        True,
        False,
    ]


def test_a_trainer_that_ended_its_share_of_the_pass_waits_and_is_no_ones_peer():
    """A trainer done with its share of the pass trains nothing while it waits: neither slow itself nor the peer
    that makes a trainer still in the pass look fast; trainers a pass apart, or crossing a pass's end in the window,
    are not compared."""
    # trainer 0 ended pass 1 before the window (1 pass finished), 1 and 2 are still in it
    rates = window(Gauge(), [(45000, 1), (20000, 0), (20000, 0)], [(45000, 1), (24000, 0), (29000, 0)])
    done, slowish, fast = rates.trainers
    assert not done.slow and done.peers_samples_per_s is None  # not in the pass the others are in
    assert slowish.peers_samples_per_s == pytest.approx(900.0) and slowish.slow  # 400 against 900: its only peer
    assert fast.peers_samples_per_s == pytest.approx(400.0) and not fast.slow
    # a trainer ending its share within the window (its passes went up) is nobody's peer either
    rates = window(Gauge(), [(40000, 0), (20000, 0)], [(45000, 1), (22000, 0)])
    assert [(t.peers_samples_per_s, t.slow) for t in rates.trainers] == [(None, False), (None, False)]
    # every trainer crossing the end of a pass: nothing compared
    rates = window(Gauge(), [(40000, 0), (39000, 0)], [(50000, 1), (45000, 1)])
    assert not any(t.slow or t.peers_samples_per_s for t in rates.trainers)
    # a record without passes (another version) is left out of the comparison, not an error
    old = trainers([(0, 0), (0, 0)])
    del old["meter.1.trainer.1"]["passes"]
    gauge = Gauge()
    gauge.observe(1000.0, 0, old, None)
    assert [t.index for t in gauge.observe(1010.0, 0, trainers([(5000, 0), (100, 0)]), None).trainers] == [0]


def learned(progress):
    """Two stage 1 trainers after ``progress`` = [(passes, pass_auc, pass_finite), ...]."""
    records = trainers([(1000 * passes, passes) for passes, _, _ in progress])
    for (_, auc, finite), record in zip(progress, records.values()):
        record.update(pass_auc=auc, pass_loss=None, pass_finite=finite)
    return records


def test_is_it_learning_the_last_pass_auc_and_a_job_that_learns_nothing_flagged():
    """Issue 53, item 4: beside the rates and the cost, the last pass's AUC as the model's own AUC op gives it; a
    pass within 0.01 of 0.5 after the first, or one that trained on values not finite, is flagged on the console."""
    learns = window(Gauge(window_s=30.0, every_s=10.0), [(0, 0)] * 2, [(2000, 2), (2000, 2)])
    assert learns.learning is None  # records without the figures (an older trainer): nothing said, nothing invented
    first = Gauge(window_s=30.0, every_s=10.0)
    first.observe(0.0, 0, learned([(1, 0.502, True), (1, 0.498, True)]), PLAN)
    rates = first.observe(10.0, 0, learned([(1, 0.502, True), (1, 0.498, True)]), PLAN)
    assert rates.learning.auc == pytest.approx(0.5) and rates.learning.verdict is None  # the first pass: not yet
    assert "; last pass 1: AUC 0.5000" in rates.lines()[-1]
    flat = Gauge(window_s=30.0, every_s=10.0)
    flat.observe(0.0, 0, learned([(2, 0.505, True), (3, 0.503, True)]), PLAN)
    rates = flat.observe(10.0, 0, learned([(2, 0.505, True), (3, 0.503, True)]), PLAN)
    assert rates.learning.passes == 2 and rates.learning.verdict.startswith("pass 2's AUC is 0.5040, within 0.01")
    assert rates.lines()[-1] == (
        "heterps launch: NOT LEARNING: pass 2's AUC is 0.5040, within 0.01 of 0.5 after the first pass: the model is "
        "not learning; the job costs 4/h all the same"
    )
    assert rates.to_record()["learning"]["verdict"] == rates.learning.verdict
    broken = Gauge(window_s=30.0, every_s=10.0)
    broken.observe(0.0, 0, learned([(1, 0.71, True), (1, None, False)]), PLAN)
    rates = broken.observe(10.0, 0, learned([(1, 0.71, True), (1, None, False)]), PLAN)
    assert rates.learning.verdict == "pass 1 trained on values that are not finite (NaN or inf)"
    fine = Gauge(window_s=30.0, every_s=10.0)
    fine.observe(0.0, 0, learned([(2, 0.77, True), (2, 0.75, True)]), PLAN)
    rates = fine.observe(10.0, 0, learned([(2, 0.77, True), (2, 0.75, True)]), PLAN)
    assert rates.learning.auc == pytest.approx(0.76) and rates.learning.verdict is None
    assert not any("NOT LEARNING" in line for line in rates.lines())


def test_hosts_held_that_run_nothing_of_the_round_are_paid_for_all_the_same():
    """Issue 53: a host standing by, one back or joined and waiting for the checkpoint costs its price; only the
    running plan's units were priced, which flattered an adaptive job's figures."""
    from heterps_paddle.launch.measuring import idle_units

    held = (("127.0.0.2", "cpu_small", 1), ("127.0.0.3", "cpu_small", 1), ("127.0.0.5", "cpu_small", 2))
    joined = {"127.0.0.4": {"type": "gpu_fast", "units": 1, "port": 1}}
    members = {"127.0.0.2": True, "127.0.0.3": True}
    connected = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
    assert idle_units(held, joined, connected, members) == {"gpu_fast": 1, "cpu_small": 2}
    assert idle_units(held, joined, ["127.0.0.2", "127.0.0.3"], members) == {}  # none connected: none held
    assert idle_units(held, {}, ["127.0.0.9"], members) == {}  # a stranger is no host of the job
    gauge = Gauge(window_s=30.0, every_s=0.0)
    gauge.idle = {"gpu_fast": 1, "cpu_small": 2}
    gauge.observe(0.0, 0, meters(0, 0.0), PLAN)
    rates = gauge.observe(3600.0, 0, meters(1000, 1.0), PLAN)
    assert rates.cost_per_hour == pytest.approx(4.0 + 2.0 + 2 * 1.0) and rates.idle_cost_per_hour == 4.0
    assert rates.cost_so_far == pytest.approx(8.0)
    assert "8/h (4/h of it for hosts held that run nothing of the round)" in rates.lines()[-2]
    gauge.idle = {"tpu": 1}  # a type without a price: the cost is not known, never one that leaves it out
    assert gauge.cost_per_hour() is None
