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
