"""The coordinator of a launch across hosts (tools/hosts_job.py) without a job: what it makes of a host that comes
back and of a spare that goes away, spoken to over its own protocol on a loopback port."""

import json
import socket
import time

from heterps_paddle.tools.hosts_job import Coordinator, HostsJob, ask_round
from heterps_paddle.tools.jobs import free_port_block

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def coordinator(lines):
    port = free_port_block(A, 1)
    job = HostsJob(f"{A}:{port}", A, A, "digest", {A: True, B: True}, restarts=2)
    return Coordinator(job, lines.append, restarts=2, checkpoint_dir=None).start()


def stand_by(endpoint, host):
    host_part, port = endpoint.rsplit(":", 1)
    conn = socket.create_connection((host_part, int(port)), timeout=5)
    conn.sendall(json.dumps({"op": "join", "host": host, "digest": "digest", "spare": True}).encode() + b"\n")
    reader = conn.makefile("rb")
    assert json.loads(reader.readline())["op"] == "standby"
    return conn


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
        coord.lost = frozenset({C})  # as after a restart that lost it
        conn = stand_by(coord.job.endpoint, C)
        wait_for(lambda: C not in coord.lost, "the host back")
        assert ask_round(coord.job.endpoint, time.monotonic() + 5)["lost"] == []
        assert any(f"host {C} is back and stands by" in line for line in lines), lines
        conn.close()  # it dies again while standing by: a later round must not count on it
        wait_for(lambda: C in coord.lost, "the spare gone")
        assert any(f"host {C}, standing by, went away" in line for line in lines), lines
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


# ---- Paddle's connect-timeout abort (tools/paddle_aborts.py): retried on the same hosts, without --restarts


def settling_coordinator(restarts, retries):
    """A coordinator whose job has started on hosts A and B, its members' connections stand-ins that keep what the
    coordinator tells them, and a re-planning that keeps the plan."""
    import io

    from heterps_paddle.tools.hosts_job import NextRound, _Peer

    job = HostsJob(f"{A}:1", A, A, "digest", {A: True, B: True}, restarts=restarts, connect_retries=retries)

    def next_round(request):
        return NextRound({"stages": []}, job, {"summary": "the same plan", "how": "no host was lost"})

    coord = Coordinator(job, [].append, restarts=restarts, next_round=next_round)
    coord.started = True
    coord.peers = {host: _Peer(host, io.BytesIO()) for host in (A, B)}
    return coord


def told(peer):
    return [json.loads(line)["op"] for line in peer.wfile.getvalue().splitlines()]


def test_the_connect_timeout_abort_is_retried_with_the_same_plan_without_restarts():
    coord = settling_coordinator(restarts=0, retries=2)
    peers = dict(coord.peers)
    with coord.lock:
        coord._trouble_or_abort("host B: trainer aborted on a connect timeout", retryable=True)
        # its peers' ends follow within seconds: counted with it, not an abort of their own
        coord._trouble_or_abort("host A: CPU trainer 0 exited with status 17")
        assert coord.aborted is None and coord.settle_at is not None
        coord._restart()
    assert coord.aborted is None
    assert (coord.round, coord.retries_left, coord.restarts_left) == (1, 1, 0)
    (event,) = coord.history
    assert event["kind"] == "retry" and event["lost"] == [], event
    assert "connect timeout" in event["why"] and "status 17" in event["why"]
    assert all(told(peer) == ["restart"] for peer in peers.values())


def test_a_retry_keeps_restarts_for_lost_hosts():
    coord = settling_coordinator(restarts=1, retries=1)
    with coord.lock:
        coord._trouble_or_abort("host B: connect timeout", retryable=True)
        coord._restart()
    assert (coord.history[-1]["kind"], coord.retries_left, coord.restarts_left) == ("retry", 0, 1)


def test_a_host_lost_while_a_retry_settles_ends_the_job_without_restarts():
    coord = settling_coordinator(restarts=0, retries=2)
    with coord.lock:
        coord._trouble_or_abort("host B: connect timeout", retryable=True)
        coord.peers[B].gone = True  # its launch went away too
        coord._restart()
    assert coord.aborted is not None and f"lost host(s) {B}" in coord.aborted, coord.aborted
    assert coord.history == []


def test_other_failures_and_spent_retries_end_the_job_at_once():
    for retries, retryable in ((2, False), (0, True)):
        coord = settling_coordinator(restarts=0, retries=retries)
        with coord.lock:
            coord._trouble_or_abort("host B: something", retryable=retryable)
        assert coord.aborted == "host B: something" and coord.settle_at is None, (retries, retryable)
        assert all(told(peer) == ["abort"] for peer in coord.peers.values())
