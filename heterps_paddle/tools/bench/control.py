"""``heterps bench control``: the launch's coordinator at cluster scale, by simulation (no Paddle, no training).

``--members N`` simulated hosts (each a real ``launch/member.py: Member``, in a process of their own) prove the job's
key, join, start and beat, while ``--knockers K`` connections that prove nothing keep knocking on the control port
(idle, garbage, half lines, each re-opened as soon as it is closed).  Then one member is lost (its connection
closes) and the coordinator decides a restart for the hosts left.  The coordinator runs in this process, so its
memory and descriptors are this process's.

It prints: join-to-start (the first join to the last member told ``start``), the loss's detection (the connection
closed to the coordinator's settling) and decision (to every other member told ``restart``; the settling time
``SETTLE_S`` is most of it, by design), the coordinator's memory and descriptors per member, the gaps between a
member's lines as the coordinator saw them (beats every BEAT_S), and how many unproven connections were refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import socket
import statistics
import threading
import time
from typing import Any

import psutil

from heterps_paddle.launch import machine as m
from heterps_paddle.launch.coordinator import SETTLE_S, Coordinator
from heterps_paddle.launch.job import BEAT_S, HostsJob, RoundPlan, RoundRequest
from heterps_paddle.launch.member import Member
from heterps_paddle.tools.jobs import free_port_block

ADDRESS = "127.0.0.1"  # the coordinator's; the members are names only (127.1.x.y), all connecting over loopback
KEY = os.urandom(32)
# what the knockers send: nothing (idle), garbage, a join without the key, half a line
KNOCKS = (b"", b"garbage\n", b'{"op": "join", "host": "x", "digest": "bench"}\n', b'{"op')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--members", type=int, default=256, help="simulated hosts that join the job (default 256)")
    parser.add_argument("--knockers", type=int, default=500, help="unproven connections held open (default 500)")
    parser.add_argument("--beat-s", type=float, default=10.0, help="seconds of beating before the loss (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def member_name(index: int) -> str:
    return f"127.1.{index // 250}.{index % 250 + 1}"


def job_for(endpoint: str, members: int, host: str = ADDRESS) -> HostsJob:
    names = [member_name(i) for i in range(members)]
    return HostsJob(
        endpoint,
        host,
        names[0],
        "bench",
        {name: True for name in names},
        restarts=1,
        key_file="",
        file_hosts=tuple(names),
        plan_writer=names[0],
    )


def _members_process(endpoint: str, members: int, knockers: int, key: bytes, pipe: Any) -> None:
    """The simulated hosts and the knockers, in their own process: their threads do not share the coordinator's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stop = threading.Event()
    knocks = [0]

    def knock(slot: int) -> None:
        host, port = endpoint.rsplit(":", 1)
        while not stop.is_set():
            try:
                with socket.create_connection((host, int(port)), timeout=30) as conn:
                    knocks[0] += 1
                    conn.sendall(KNOCKS[slot % len(KNOCKS)])
                    conn.recv(1 << 12)  # the challenge, then wait to be closed
                    while conn.recv(1 << 12):
                        pass
            except OSError:
                time.sleep(0.05)

    for slot in range(knockers):
        threading.Thread(target=knock, args=(slot,), daemon=True).start()
    job = job_for(endpoint, members)
    joined: dict[str, float] = {}
    hosts: dict[str, Member] = {}

    def join(name: str) -> None:
        member = Member(dataclasses.replace(job, host=name), key)
        member.join()
        joined[name] = time.monotonic()
        hosts[name] = member

    first = time.monotonic()
    threads = [threading.Thread(target=join, args=(member_name(i),)) for i in range(members)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pipe.send({"joined": len(joined), "join_to_start_s": max(joined.values()) - first, "knocks": knocks[0]})
    pipe.recv()  # beat until told to lose one
    lost = member_name(members - 1)
    lost_at = time.monotonic()
    hosts[lost].close()
    told: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(told) < members - 1 and time.monotonic() < deadline:
        for name, member in hosts.items():
            if name != lost and name not in told and member.restart is not None:
                told[name] = time.monotonic()
        time.sleep(0.01)
    decision = (max(told.values()) - lost_at) if told else None
    pipe.send({"lost": lost, "decision_s": decision, "told": len(told), "knocks": knocks[0]})
    stop.set()
    for member in hosts.values():
        member.close()


def run(args: argparse.Namespace) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # the baseline first, in the same run: the same members with nobody knocking (this machine is shared and noisy)
    quiet = measure(args.members, 0, args.beat_s)
    knocked = measure(args.members, args.knockers, args.beat_s)
    result = {
        "members": args.members,
        "knockers": args.knockers,
        "quiet": quiet,
        "knocked": knocked,
        "join_to_start_knocked_over_quiet": _ratio(knocked["join_to_start_s"], quiet["join_to_start_s"]),
        "decision_knocked_over_quiet": _ratio(knocked["loss_to_decision_s"], quiet["loss_to_decision_s"]),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("quiet", "knocked"):
            print(f"{name}:")
            for key, value in result[name].items():
                print(f"  {key}: {value}")
        print(f"join to start, knocked / quiet: {result['join_to_start_knocked_over_quiet']}")
        print(f"loss to decision, knocked / quiet: {result['decision_knocked_over_quiet']}")
    return 0 if quiet["decided"] and knocked["decided"] else 1


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def measure(members: int, knockers: int, beat_s: float) -> dict[str, Any]:
    """One job of ``members`` simulated hosts with ``knockers`` unproven connections knocking: what it printed."""
    me = psutil.Process()
    rss_before, fds_before = me.memory_info().rss, me.num_fds()
    endpoint = f"{ADDRESS}:{free_port_block(ADDRESS, 1)}"
    job = job_for(endpoint, members)
    detected: list[float] = []

    def say(text: str) -> None:
        if "the job will start again" in text and not detected:
            detected.append(time.monotonic())

    def next_round(request: RoundRequest) -> RoundPlan:
        left = {h: trains for h, trains in job.members.items() if h not in request.lost}
        again = dataclasses.replace(job, members=left, digest="bench-1")
        return RoundPlan({"stages": []}, again, {"summary": "the same plan on the hosts left"})

    coordinator = Coordinator(job, say, KEY, restarts=1, next_round=next_round).start()
    gaps: list[float] = []
    sampling = threading.Event()

    def sample() -> None:  # how long since each member's last line, as the coordinator saw it
        while not sampling.wait(0.5):
            now = time.monotonic()
            with coordinator.lock:
                ages = [now - peer.last_seen for peer in coordinator.members.values() if not peer.gone]
            if ages:
                gaps.append(max(ages))

    parent, child = multiprocessing.Pipe()
    context = multiprocessing.get_context("fork")
    process = context.Process(target=_members_process, args=(endpoint, members, knockers, KEY, child), daemon=True)
    process.start()
    try:
        started = parent.recv()
        rss_after, fds_after = me.memory_info().rss, me.num_fds()
        threading.Thread(target=sample, daemon=True).start()
        time.sleep(beat_s)
        sampling.set()
        loss_at = time.monotonic()
        parent.send("lose one")
        lost = parent.recv()
        with coordinator.server.lock:
            refused = coordinator.server.refused
        return {
            "joined": started["joined"],
            "join_to_start_s": round(started["join_to_start_s"], 3),
            "loss_detected_s": round(detected[0] - loss_at, 3) if detected else None,
            "loss_to_decision_s": None if lost["decision_s"] is None else round(lost["decision_s"], 3),
            "settle_s": SETTLE_S,
            "members_told_restart": lost["told"],
            "decided": coordinator.machine.round.number == 1 and coordinator.machine.state is m.JobState.JOINING,
            "coordinator_rss_mb": round(rss_after / 2**20, 1),
            "coordinator_rss_kb_per_member": round((rss_after - rss_before) / 1024 / members, 1),
            "coordinator_fds_per_member": round((fds_after - fds_before) / members, 2),
            "beat_s": BEAT_S,
            "beat_gap_median_s": round(statistics.median(gaps), 3) if gaps else None,
            "beat_gap_max_s": round(max(gaps), 3) if gaps else None,
            "unproven_knocks": lost["knocks"],
            "refused_connections": refused,
        }
    finally:
        process.terminate()
        process.join(10)
        coordinator.close(wait_s=1.0, late_joiners_s=0.0)
