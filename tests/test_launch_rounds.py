"""The launch's one round loop (launch/driver.py: ``_rounds``) with fake children: what the machine decides after
each round's facts (a retry, the end, an abort), said on the console and in the event log, without Paddle.  One
launched job per kind of decision stays in tests/test_launch_failures.py and tests/test_across_hosts.py."""

import pytest

from heterps_paddle.launch import driver, event_log
from heterps_paddle.launch.console import Console
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.result import Outcome, RunResult

ABORT = RunResult(Outcome.FAILED, "stage 2 heterogeneous trainer 0 was killed by SIGABRT", None, True)
CRASH = RunResult(Outcome.FAILED, "CPU trainer 1 exited with status 1", None, False)
OK = RunResult(Outcome.SUCCEEDED)


class Lines(Console):
    def __init__(self):
        super().__init__()
        self.said = []

    def line(self, text, stream=None):
        self.said.append(text)


def one_host(monkeypatch, tmp_path, results, retries):
    """``heterps launch`` on one host whose rounds' children report ``results`` in turn: its end, what it said,
    its event log, and how many rounds ran."""
    monkeypatch.setenv("HETERPS_CONNECT_RETRIES", str(retries))
    ran = []

    def fake_round(turn, console, coordinator):
        ran.append(turn.number)
        result = results[len(ran) - 1]
        return driver.Ran(result, str(tmp_path), 0 if result.outcome is Outcome.SUCCEEDED else 1)

    monkeypatch.setattr(driver, "_run_round", fake_round)
    options = LaunchOptions(script="train.py", paddle=(("--log_dir", str(tmp_path)),))
    console, log = Lines(), event_log.EventLog(str(tmp_path))
    end = driver._rounds(driver.OneHost(options, console, log), console, log)
    return end, "\n".join(console.said), event_log.read(str(tmp_path)), ran


def test_the_connect_timeout_abort_is_retried_and_the_job_ends_well(monkeypatch, tmp_path):
    end, said, records, ran = one_host(monkeypatch, tmp_path, [ABORT, OK], retries=2)
    assert (end.code, end.how, ran) == (0, "finished", [0, 1])
    assert "heterps launch: aborted: stage 2 heterogeneous trainer 0 was killed by SIGABRT" in said
    assert "starting the job again (retry 1 of 2, HETERPS_CONNECT_RETRIES)" in said
    assert "FAILED" not in said
    types = [r["type"] for r in records]
    assert types == [
        "round_started",
        "host_round",
        "host_failed",
        "settling",
        "replanning",
        "round_planned",
        "round_started",
        "host_round",
        "job_ended",
    ]
    assert records[5]["kind"] == "retry" and records[2]["connect_timeout"] is True


@pytest.mark.parametrize(
    "results,retries,runs",
    [([ABORT], 0, 1), ([CRASH], 2, 1), ([ABORT, ABORT, ABORT], 2, 3)],
    ids=["no-retries", "not-the-abort", "retries-spent"],
)
def test_what_is_not_retried_fails_the_job_naming_it(monkeypatch, tmp_path, results, retries, runs):
    end, said, records, ran = one_host(monkeypatch, tmp_path, results, retries)
    assert (end.code, end.how, len(ran)) == (1, "failed", runs)
    assert f"heterps launch: FAILED: {results[-1].failure}" in said
    assert said.count("aborted:") == runs - 1
    assert [r["type"] for r in records][-1] == "job_aborted"
    assert sum(r["type"] == "round_planned" for r in records) == runs - 1


def test_a_child_that_left_no_result_is_a_failure():
    result = RunResult.parse(b"", -9)
    assert result.outcome is Outcome.FAILED and "ended (status -9) without a result" in result.failure
    assert RunResult.parse(ABORT.line(), 1) == ABORT
