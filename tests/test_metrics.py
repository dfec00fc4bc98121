"""The job's figures (launch/figures.py) as ``heterps status`` prints them and the metrics endpoint serves them
(launch/metrics_server.py), from one event log: the two agree; the endpoint is read-only and bounded (garbage, huge
and slow requests, floods of connections change nothing and grow nothing).  No job: a canned log.  A launched job's
status, console and metrics against the samples it trained: tests/test_launched_ps.py and the jobs across hosts."""

import json
import re
import socket
import time
import urllib.request

import psutil
import pytest
from conftest import run_cli

from heterps_paddle.launch import driver
from heterps_paddle.launch.event_log import EventLog
from heterps_paddle.launch.metrics_server import MAX_CONNECTIONS, MAX_REQUEST, MetricsServer
from heterps_paddle.launch.options import parse
from heterps_paddle.tools.jobs import free_port_block

STAGES = [
    {
        "stage": 1,
        "resource": "cpu_small",
        "kind": "cpu",
        "units": 2,
        "predicted_samples_per_s": 950.0,
        "samples_per_s": 1000.0,
        "work_share": 0.5,
        "wait_share": 0.5,
        "waiting_for": "next",
        "capacity_samples_per_s": 2000.0,
        "price_per_hour": 1.0,
    },
    {
        "stage": 2,
        "resource": "gpu_fast",
        "kind": "gpu",
        "units": 1,
        "predicted_samples_per_s": 900.0,
        "samples_per_s": 1000.0,
        "work_share": None,
        "wait_share": None,
        "waiting_for": "previous",
        "capacity_samples_per_s": None,
        "price_per_hour": 2.0,
    },
]


def canned_log(path):
    log = EventLog(str(path))
    log.write("launch_started", host="127.0.0.2", pid=1, across_hosts=True, version="x")
    log.write("round_started", round=0, hosts=["127.0.0.2"], digest="d")
    rates = dict(
        round=0,
        window_s=30.0,
        samples_per_s=1000.0,
        predicted_samples_per_s=900.0,
        target_samples_per_s=800.0,
        cost_per_hour=4.0,
        stages=STAGES,
    )
    log.write("rates", samples=10000, cost_so_far=0.01, cost_per_million_samples=1.11, **rates)
    log.write(
        "round_planned",
        round=1,
        kind="move",
        at="t",
        why="host(s) 127.0.0.4 back",
        lost=[],
        lost_so_far=[],
        left=[],
        joined=[],
        hosts=["127.0.0.2"],
    )
    log.write(
        "adapt",
        decision="replace",
        why="host 127.0.0.3 is slow: its trainers trained 43% of their peers' samples/s in the same pass",
        proposal=None,
        replace={"host": "127.0.0.3", "resource": "cpu_small", "price_per_hour": 1.0, "share_of_peers": 0.43},
    )
    trainers = [
        {
            "host": "127.0.0.2",
            "index": 0,
            "samples_per_s": 700.0,
            "peers_samples_per_s": 300.0,
            "share_of_peers": 2.333,
            "slow": False,
        },
        {
            "host": "127.0.0.3",
            "index": 1,
            "samples_per_s": 300.0,
            "peers_samples_per_s": 700.0,
            "share_of_peers": 0.429,
            "slow": True,
        },
    ]
    log.write(
        "rates",
        samples=25000,
        cost_so_far=0.02,
        cost_per_million_samples=1.11,
        trainers=trainers,
        seconds_over_job=50.0,
        samples_per_s_over_job=500.0,
        cost_per_million_samples_over_job=0.8,
        samples_over_round=15000,
        seconds_over_round=20.0,
        cost_over_round=0.01,
        samples_per_s_over_round=750.0,
        cost_per_million_samples_over_round=0.667,
        learning={"passes": 2, "auc": 0.5031, "loss": 0.69, "finite": True, "verdict": "pass 2's AUC is 0.5031"},
        **{**rates, "round": 1},
    )
    return str(path)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
        return answer.read().decode()


def value(text, name):
    return float(
        next(
            line.split()[-1] for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")
        )
    )


def test_status_and_metrics_say_the_same_figures(tmp_path, capsys):
    log_dir = canned_log(tmp_path)
    code, out, _ = run_cli(capsys, "status", log_dir, "--json")
    status = json.loads(out)
    assert code == 0 and status["state"] == "running" and status["round"] == 1 and status["samples"] == 25000
    assert [r["kind"] for r in status["rounds"]] == ["move"]
    code, text, _ = run_cli(capsys, "status", log_dir, "--plot", str(tmp_path / "status.png"))
    assert (tmp_path / "status.png").stat().st_size > 0
    assert "samples/s: 1,000 measured over the last 30 s, 900 predicted, target 800" in text
    assert "cost: 4/h, 0.02 so far, 1.11 per million samples over the last window" in text
    assert "over the job: 25,000 samples in 50 s, 500 samples/s; cost 0.02, 0.8 per million samples" in text
    assert "round 1: 15,000 samples in 20 s, 750 samples/s; cost 0.01, 0.667 per million samples" in text
    assert "NOT LEARNING: pass 2's AUC is 0.5031" in text and status["learning"]["auc"] == 0.5031
    # a running job leads with how it goes now
    assert text.index("samples/s: 1,000 measured") < text.index("over the job:")
    assert "stage 1: 2 x cpu_small (cpu) at 1/h each: 1,000 samples/s measured vs 950 predicted, work 50%" in text
    assert "  host 127.0.0.3 (trainer 1): 300 samples/s, 43% of its peers' in the same pass: slow" in text
    assert "host 127.0.0.2 (trainer 0)" not in text and [t["slow"] for t in status["trainers"]] == [False, True]
    (decided,) = status["decisions"]
    assert decided["decision"] == "replace" and decided["replace"]["host"] == "127.0.0.3"
    assert re.search(r"adapt \(\d\d:\d\d:\d\d\): replace: host 127.0.0.3 is slow", text), text
    port = free_port_block("127.0.0.1", 1)
    server = MetricsServer("127.0.0.1", port, log_dir).start()
    try:
        text = scrape(port)
    finally:
        server.close()
    assert value(text, "heterps_samples_trained_total") == status["samples"]
    assert value(text, "heterps_samples_per_second_last_window") == status["samples_per_s_last_window"] == 1000
    assert value(text, "heterps_cost_total") == status["cost_so_far"]
    assert value(text, "heterps_cost_per_million_samples_last_window") == status["cost_per_million_samples_last_window"]
    assert value(text, "heterps_cost_per_million_samples_over_job") == status["cost_per_million_samples_over_job"]
    assert value(text, "heterps_cost_per_million_samples_over_round") == 0.667
    assert value(text, "heterps_samples_per_second_over_job") == 500 and value(text, "heterps_seconds_over_job") == 50
    assert value(text, "heterps_samples_over_round") == 15000 and value(text, "heterps_cost_over_round") == 0.01
    assert 'heterps_rounds_total{kind="move"} 1.0' in text and value(text, "heterps_job_round") == 1
    assert 'heterps_rounds_total{kind="adapt"} 0.0' in text  # every kind of round, adaptive moves included
    assert value(text, "heterps_pass_auc") == 0.5031 and value(text, "heterps_pass_loss") == 0.69
    assert value(text, "heterps_not_learning") == 1
    assert 'heterps_stage_work_ratio{kind="cpu",resource="cpu_small",stage="1"} 0.5' in text
    assert 'heterps_trainer_slow{host="127.0.0.3",index="1"} 1.0' in text
    assert 'heterps_trainer_slow{host="127.0.0.2",index="0"} 0.0' in text
    assert 'heterps_trainer_peer_ratio{host="127.0.0.3",index="1"} 0.429' in text
    assert "gpu_fast" in text and 'heterps_stage_work_ratio{kind="gpu"' not in text  # not measured: not invented
    assert str(tmp_path) not in text and "pid" not in text  # no path, no process of the job


def test_the_endpoint_is_read_only_and_bounded(tmp_path):
    log_dir = canned_log(tmp_path)
    before = open(log_dir + "/heterps-events.jsonl").read()
    port = free_port_block("127.0.0.1", 1)
    server = MetricsServer("127.0.0.1", port, log_dir).start()
    me = psutil.Process()
    try:
        good = scrape(port)
        threads, fds = me.num_threads(), me.num_fds()

        def ask(payload, shut=True):
            with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
                conn.sendall(payload)
                if shut:
                    conn.shutdown(socket.SHUT_WR)
                return conn.recv(1 << 16)

        assert ask(b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert ask(b"x" * (4 * MAX_REQUEST), shut=False).startswith(b"HTTP/1.1 431")
        assert ask(b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
        assert ask(b"GET /../etc/passwd HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
        assert ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").split(b"\r\n\r\n", 1)[1].startswith(b"# HELP")
        # a flood of idle connections: at most MAX_CONNECTIONS are served at once, the rest closed unanswered
        flood = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(MAX_CONNECTIONS + 40)]
        time.sleep(0.5)
        assert me.num_threads() <= threads + MAX_CONNECTIONS + 2
        for conn in flood:
            conn.close()
        deadline = time.monotonic() + 20  # the idle ones time out (REQUEST_S)
        while (me.num_threads() > threads + 1 or me.num_fds() > fds + 1) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert me.num_threads() <= threads + 1 and me.num_fds() <= fds + 1
        assert (
            scrape(port).split("heterps_measurement_age_seconds")[0] == good.split("heterps_measurement_age_seconds")[0]
        )
    finally:
        server.close()
    assert open(log_dir + "/heterps-events.jsonl").read() == before  # nothing written


def test_a_metrics_port_taken_is_refused_before_anything_starts(tmp_path, capsys):
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        options = parse(["--metrics-port", str(port), "--log_dir", str(tmp_path / "log"), str(tmp_path / "train.py")])
        assert driver.run(options) == 2
    assert f"--metrics-port {port}: cannot serve on 127.0.0.1:{port}" in capsys.readouterr().err
    with pytest.raises(Exception, match="port number"):
        parse(["--metrics-port", "70000", str(tmp_path / "train.py")])


def test_status_of_a_directory_without_a_log_names_it(tmp_path, capsys):
    code, _, err = run_cli(capsys, "status", str(tmp_path))
    assert code == 2 and "no event log" in err and str(tmp_path) in err
