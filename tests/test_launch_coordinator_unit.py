"""The coordinator of a launch across hosts (launch/coordinator.py) without a job: the shell around the job's state
machine, spoken to over its own protocol on a loopback port.  The rules themselves: tests/test_launch_machine.py."""

import json
import socket
import time
from dataclasses import replace

from heterps_paddle.launch.coordinator import Coordinator
from heterps_paddle.launch.job import HostsJob, RoundPlan, ask_round
from heterps_paddle.tools.jobs import free_port_block

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def coordinator(lines, next_round=None, restarts=2, retries=0):
    port = free_port_block(A, 1)
    job = HostsJob(f"{A}:{port}", A, A, "digest", {A: True, B: True}, restarts=restarts, connect_retries=retries)
    return Coordinator(job, lines.append, restarts=restarts, next_round=next_round, settle_s=0.2).start()


def connect(endpoint, message):
    host_part, port = endpoint.rsplit(":", 1)
    conn = socket.create_connection((host_part, int(port)), timeout=10)
    conn.sendall(json.dumps(message).encode() + b"\n")
    return conn, conn.makefile("rb")


def next_op(reader):
    told = json.loads(reader.readline())
    while told["op"] == "beat":
        told = json.loads(reader.readline())
    return told


def wait_for(check, what):
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_lost_host_back_and_a_spare_gone():
    lines = []
    coord = coordinator(lines)
    try:
        assert ask_round(coord.job.endpoint, time.monotonic() + 5) == {"round": 0, "plan": None, "lost": []}
        with coord.lock:
            coord.machine = replace(coord.machine, lost=frozenset({C}))  # as after a restart that lost it
        conn, reader = connect(coord.job.endpoint, {"op": "join", "host": C, "digest": "digest", "spare": True})
        assert json.loads(reader.readline())["op"] == "standby"
        wait_for(lambda: C not in coord.machine.lost, "the host back")
        assert ask_round(coord.job.endpoint, time.monotonic() + 5)["lost"] == []
        assert any(f"host {C} is back and stands by" in line for line in lines), lines
        reader.close()
        conn.close()  # it dies again while standing by: a later round must not count on it
        wait_for(lambda: C in coord.machine.lost, "the spare gone")
        assert any(f"host {C}, standing by, went away" in line for line in lines), lines
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_members_join_start_and_a_retry_tells_every_host_the_new_round(tmp_path):
    """Two members join and start; the first failure is Paddle's connect-timeout abort: after settling, both hear
    ``restart`` with the same plan, restarts.json says a retry, and the next round's joins start it again."""
    lines = []
    plans = []

    def next_round(request):
        plans.append(request)
        return RoundPlan({"stages": []}, coord.job, {"summary": "the same plan", "how": "no host was lost"})

    coord = coordinator(lines, next_round, restarts=0, retries=1)
    coord.restarts_path = str(tmp_path / "restarts.json")
    try:
        joined = [connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)]
        for _, reader in joined:
            assert next_op(reader)["op"] == "start"
        joined[1][0].sendall(json.dumps({"op": "failed", "reason": "aborted", "retryable": True}).encode() + b"\n")
        for _, reader in joined:
            told = next_op(reader)
            assert told["op"] == "restart" and told["round"] == 1 and told["lost"] == [], told
        assert plans and plans[0].lost == frozenset() and plans[0].number == 1
        history = json.loads((tmp_path / "restarts.json").read_text())["restarts"]
        assert [event["kind"] for event in history] == ["retry"]
        assert any("retry 1 after Paddle's connect-timeout abort (0 left; round 1)" in line for line in lines), lines
        for conn, reader in joined:
            reader.close()
            conn.close()
        again = [connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)]
        for _, reader in again:
            assert next_op(reader)["op"] == "start"
        for conn, _ in again:
            conn.sendall(json.dumps({"op": "done"}).encode() + b"\n")
        wait_for(lambda: coord.ended, "the end")
        for conn, reader in again:
            reader.close()
            conn.close()
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_member_with_another_digest_ends_the_launch_before_it_starts():
    lines = []
    coord = coordinator(lines)
    try:
        _, first = connect(coord.job.endpoint, {"op": "join", "host": A, "digest": "digest"})
        _, other = connect(coord.job.endpoint, {"op": "join", "host": B, "digest": "other"})
        for reader in (first, other):
            told = next_op(reader)
            assert told["op"] == "abort" and f"host {B} was given another plan" in told["reason"], told
        _, stranger = connect(coord.job.endpoint, {"op": "join", "host": C, "digest": "digest"})
        assert "runs nothing of this launch's plan" in json.loads(stranger.readline())["reason"]
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_lost_host_is_replanned_without_it(tmp_path):
    """The re-planning is asked for the hosts left: the lost one in ``lost``, not yet in ``lost_before``."""
    lines, plans = [], []

    def next_round(request):
        plans.append(request)
        return RoundPlan({"stages": []}, coord.job, {"summary": "without B", "how": "re-planned"})

    coord = coordinator(lines, next_round, restarts=1)
    try:
        joined = {h: connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)}
        for _, reader in joined.values():
            assert next_op(reader)["op"] == "start"
        conn, reader = joined[B]
        reader.close()
        conn.close()  # host B is gone
        told = next_op(joined[A][1])
        assert told["op"] == "restart" and told["lost"] == [B], told
        assert plans[0].lost == frozenset({B}) and plans[0].lost_before == frozenset(), plans
        assert any(f"restart 1 (0 left; round 1): lost {B}" in line for line in lines), lines
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)
