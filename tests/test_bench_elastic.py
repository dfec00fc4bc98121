"""``heterps bench elastic`` (tools/bench/elastic.py): its reading of the event log and of log lines, the split of a recovery
into phases, the checkpoints' figures from the barrier's files, on canned lines and files (no launch); and one small
real run (launched), whose JSON is checked for its shape and that its phases add up, never for a time."""

import json

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.tools.bench import elastic
from heterps_paddle.tools.cli import build_parser

KILL = 100.0
WALL = 1_764_000_000.0  # the event log's clock, this far ahead of the harness's
# A coordinator's event log as tests/test_host_restarts.py's job writes it, the heterogeneous host killed at KILL.
EVENTS = [
    {"t": WALL + KILL - 10, "type": "round_started", "round": 0, "hosts": ["127.0.0.2", "127.0.0.3", "127.0.0.4"]},
    {
        "t": WALL + KILL + 0.05,
        "type": "settling",
        "reason": "host 127.0.0.4's heterps launch went away",
        "kind": "restart",
    },
    {"t": WALL + KILL + 0.3, "type": "settling", "reason": "host 127.0.0.2: trainer 0 FAILED", "kind": "restart"},
    {"t": WALL + KILL + 7.4, "type": "replanning", "kind": "restart", "lost": ["127.0.0.4"]},
    {"t": WALL + KILL + 7.5, "type": "round_planned", "round": 1, "kind": "restart", "lost": ["127.0.0.4"]},
    {"t": WALL + KILL + 9.0, "type": "round_started", "round": 1, "hosts": ["127.0.0.2", "127.0.0.3"]},
]


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_the_marks_of_the_jobs_life_come_from_the_event_log():
    assert elastic.first_event(EVENTS, elastic.DETECTED, KILL, WALL) == pytest.approx(KILL + 0.05)
    assert elastic.first_event(EVENTS, elastic.DECIDED, KILL, WALL) == pytest.approx(KILL + 7.5)
    assert elastic.first_event(EVENTS, elastic.LEFT, KILL, WALL) is None  # a restart, not a leave
    assert elastic.first_event(EVENTS, elastic.STARTS, 0.0, WALL) == pytest.approx(KILL - 10)  # the first round's
    assert elastic.first_event(EVENTS, elastic.STARTS, KILL + 7.5, WALL) == pytest.approx(KILL + 9.0)  # the new one's
    assert elastic.first_event(EVENTS, elastic.STARTS, KILL + 10, WALL) is None
    left = [{**EVENTS[4], "kind": "leave"}]
    assert elastic.first_event(left, elastic.LEFT, KILL, WALL) == pytest.approx(KILL + 7.5)


def test_a_tail_stamps_each_whole_line_when_it_is_read_and_finds_the_first_after_a_time(tmp_path):
    path = str(tmp_path / "workerlog.0")
    clock = Clock(KILL - 10)
    tail = elastic.Tail(clock)
    batch = "time: [2026-11-25 14:20:40], batch: [1], loss[1]:[0.69]"
    with open(path, "w") as f:
        f.write("worker 1 epoch 0: train auc 0.6\n" + batch + "\n")
    tail.poll([path, str(tmp_path / "not-yet")])
    clock.now = KILL + 0.05
    with open(path, "a") as f:
        f.write("heterps: pass 2\ntime: [2026-11-25 14:21:40], ba")  # a half line waits for its end
    tail.poll([path])
    clock.now = KILL + 7.5
    with open(path, "a") as f:
        f.write("tch: [2], loss[1]:[0.69]\n")
    tail.poll([path])
    assert [t for t, _ in tail.lines[path]] == [KILL - 10, KILL - 10, KILL + 0.05, KILL + 7.5]
    assert tail.lines[path][3][1] == "time: [2026-11-25 14:21:40], batch: [2], loss[1]:[0.69]"
    assert tail.first(path, elastic.BATCH) == KILL - 10
    assert tail.first(path, elastic.BATCH, KILL) == KILL + 7.5
    assert tail.first(path, elastic.BATCH, KILL + 8) is None
    assert len(tail.matches(path, elastic.BATCH)) == 2


def test_the_log_lines_the_benchmark_reads():
    assert elastic.BATCH.search("time: [2026-11-25 14:20:40], batch: [1], loss[1]:[0.69]")
    assert not elastic.BATCH.search("worker 0 epoch 1: train auc 0.7")
    assert elastic.RESUMING.search(
        "heterps: init_server: resuming from the launch's checkpoint /d/pass-000001 (1 passes done)"
    )
    assert elastic.RESTORED.search("heterps: init_server(/d/pass-000001): 3 dense tables restored (same layout)")
    assert elastic.pass_starts(["x", "elastic-bench: pass 2 starts at 1764080000.250", "pass 3"]) == {2: 1764080000.25}


def test_a_recovery_is_split_into_phases_that_add_up_to_the_total():
    marks = {"kill": KILL, "detected": KILL + 0.05, "decided": KILL + 7.25, "joined": KILL + 8.0}
    marks.update(resuming=KILL + 15.0, restored=KILL + 16.0, first_batch=KILL + 18.5)
    result = elastic.split_recovery(marks, settle_s=5.0)
    assert list(result["phases_s"]) == list(elastic.PHASES)
    assert result["phases_s"] == {
        "detection": 0.05,
        "settling": 5.0,
        "replanning": 2.2,
        "restart": 7.75,
        "restore": 3.5,
    }
    assert sum(result["phases_s"].values()) == pytest.approx(result["total_s"]) == 18.5
    assert result["within_goal"] is (18.5 <= elastic.RECOVERY_GOAL_S)
    assert result["marks_after_kill_s"]["joined"] == 8.0 and result["marks_after_kill_s"]["restored"] == 16.0
    # a decision sooner than the settling (it cannot be, by the machine's rule; the phases still add up)
    quick = elastic.split_recovery({**marks, "decided": KILL + 3.0}, settle_s=5.0)
    assert quick["phases_s"]["replanning"] == 0.0
    assert sum(quick["phases_s"].values()) == pytest.approx(quick["total_s"])


def test_a_missing_mark_names_the_phase():
    with pytest.raises(elastic.PhaseMissing, match="no decided mark"):
        elastic.split_recovery({"kill": KILL, "detected": KILL + 1, "decided": None}, settle_s=5.0)


def test_checkpoints_figures_from_the_barrier_files_the_logs_and_the_manifests():
    # the barrier's files as Job records them (name -> mtime): trainer 0 removes a pass's files after the next pass
    files = {}
    for passes, arrived, decision, captured in ((1, 110.0, 110.5, 114.0), (2, 120.0, 120.25, 121.0)):
        for what, at in (
            ("arrived.0", arrived),
            ("arrived.1", arrived),
            ("decision", decision),
            ("captured", captured),
        ):
            files[f"pass-{passes:06d}.{what}"] = at
    files["pass-000003.arrived.0"] = 130.0  # a save that never finished is not a checkpoint
    files["pass-000003.flushed.0"] = 131.0
    barriers = elastic.barrier_marks(files)
    assert barriers == {1: elastic.Barrier(110.0, 110.5, 114.0), 2: elastic.Barrier(120.0, 120.25, 121.0)}
    logged = elastic.logged_checkpoints(
        [
            "heterps: checkpoint /d/pass-000001: complete (1 passes done; its manifest written last, then renamed)",
            "heterps: checkpoint /d/pass-000002: complete (2 passes done; kind=incremental bytes=5000 seconds=0.800 chain=2; "
            "its manifest written last, then renamed)",
        ]
    )
    assert logged[1] == {"kind": None, "bytes": None, "seconds": None}
    assert logged[2] == {"kind": "incremental", "bytes": 5000, "seconds": 0.8}
    rows = elastic.checkpoint_rows(barriers, {1: 100.0, 2: 115.0}, {1: 100000, 2: 6000}, logged, {})
    assert [r["kind"] for r in rows] == ["full", "incremental"]
    assert rows[0]["seconds"] == 3.5 and rows[0]["barrier_seconds"] == 0.5 and rows[0]["train_seconds_before"] == 10.0
    assert rows[1]["seconds_logged"] == 0.8 and rows[1]["bytes_logged"] == 5000
    summary = elastic.checkpoint_summary(rows, job_s=21.0, incremental_setting=True)
    assert summary["incremental"]["bytes_over_full"] == 0.06 and summary["incremental"]["within_goal"] is True
    assert summary["checkpoint_seconds"] == 4.25 and summary["barrier_seconds"] == 0.75
    assert summary["overhead"] == round(4.25 / 21.0, 4) and summary["overhead_within_goal"] is False
    # each kind as if every checkpoint were of it: its seconds over them and the mean training (10 s and 5 s)
    assert summary["train_seconds_between_mean"] == 7.5
    assert summary["full"] == {"count": 1, "bytes": 100000, "seconds": 3.5, "overhead_if_every": round(3.5 / 11, 4)}
    assert summary["incremental"]["overhead_if_every"] == round(0.75 / 8.25, 4)
    # every checkpoint full: incremental is null, with why
    full_only = elastic.checkpoint_summary(rows[:1], job_s=14.0, incremental_setting=False)
    assert full_only["incremental"] is None and "HETERPS_CHECKPOINT_BASE_EVERY" in full_only["incremental_missing"]
    manifests = {1: {"launch": {"kind": "full", "bytes": 99, "save_s": 3.0, "pause_s": 0.5, "persist_s": 2.5}}}
    from_manifest = elastic.checkpoint_rows(barriers, {}, {}, {}, manifests)
    assert from_manifest[0]["bytes_logged"] == 99 and from_manifest[0]["seconds_logged"] == 3.0
    assert from_manifest[0]["pause_seconds_logged"] == 0.5 and from_manifest[0]["persist_seconds_logged"] == 2.5
    assert from_manifest[0]["train_seconds_before"] is None


def test_the_share_of_the_table_a_pass_touches(tmp_path):
    passes = [
        generate(str(tmp_path / f"p{k}"), rows, seed=k, test_fraction=0.5).train_files
        for k, rows in ((1, 400), (2, 20))
    ]
    first, second = elastic.touched_shares(passes)
    assert first == 1.0 and 0 < second < 0.2


def test_the_command_is_registered_and_its_report_reads(capsys):
    args = build_parser().parse_args(["bench", "elastic", "--passes", "3", "--phases", "recovery", "--json"])
    assert args.benchmark_run is elastic.run and args.passes == 3 and args.phases == ["recovery"]
    recovery = elastic.split_recovery(
        {"kill": 0.0, "detected": 0.1, "decided": 7.0, "resuming": 12.0, "first_batch": 14.0}, settle_s=5.0
    )
    report = {"passes": 3, "rows": 100, "pass_rows": 5, "touched_share": [1.0, 0.05], "load_average": [1, 1, 1]}
    report["base_every"] = None
    report.update(steady=None, recovery=recovery, leave=None, leave_missing="not yet")
    text = elastic.table(report)
    assert "detection 0.10 s" in text and "total 14.00 s" in text and "leave: not yet" in text
    left = elastic.split_leave(
        {
            "notice": 0.0,
            "asked": 0.05,
            "saved": 4.0,
            "decided": 6.0,
            "joined": 7.0,
            "resuming": 15.0,
            "first_batch": 20.0,
        }
    )
    assert left["phases_s"] == {"checkpoint": 4.0, "replanning": 2.0, "restart": 9.0, "restore": 5.0}
    assert sum(left["phases_s"].values()) == left["total_s"] == 20.0 and left["marks_after_notice_s"]["joined"] == 7
    with pytest.raises(elastic.PhaseMissing, match="leave: no decided mark"):
        elastic.split_leave({"notice": 0.0, "saved": 4.0, "decided": None})
    left.update(checkpoint="pass-000001.4of8")
    assert "leave: {'checkpoint': 4.0" in elastic.table({**report, "leave": left})
    assert "from pass-000001.4of8" in elastic.table({**report, "leave": left})
    assert isinstance(elastic.leave_support(), (str, type(None)))


def test_bad_sizes_are_refused_before_any_work():
    args = build_parser().parse_args(["bench", "elastic", "--passes", "2"])
    with pytest.raises(elastic.HeterPSError, match="--passes must be >= 3"):
        elastic.run(args)


@pytest.mark.launched
def test_a_small_real_recovery_prints_its_json(capsys):
    """The recovery alone (the steady job's checkpoints take most of a full run's minutes: their figures are checked
    above on canned files)."""
    argv = ["bench", "elastic", "--rows", "2000", "--pass-rows", "60", "--passes", "3", "--phases", "recovery"]
    assert elastic.run(build_parser().parse_args([*argv, "--json"])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["benchmark"] == "elastic" and len(report["touched_share"]) == 3 and report["work_dir"] is None
    assert report["steady"] is None and report["leave"] is None and "leave_missing" not in report
    recovery = report["recovery"]
    assert list(recovery["phases_s"]) == list(elastic.PHASES)
    assert sum(recovery["phases_s"].values()) == pytest.approx(recovery["total_s"], abs=0.01)
    assert all(value >= 0 for value in recovery["phases_s"].values())
    assert {"joined", "restored"} <= set(recovery["marks_after_kill_s"])
    assert recovery["left_running"] == [] and recovery["restart"]["lost"] == [elastic.C]
