"""The coordinator of a launch across hosts (launch/coordinator.py) without a job: the shell around the job's state
machine, spoken to over its own protocol on a loopback port, by genuine members (which prove the job's key) and by
strangers.  The rules themselves: tests/test_launch_machine.py."""

import json
import re
import socket
import time
from dataclasses import replace

import pytest

from heterps_paddle import control
from heterps_paddle.launch.control_server import MAX_UNPROVEN
from heterps_paddle.launch.coordinator import Coordinator
from heterps_paddle.launch.job import HostsJob, RoundPlan, ask_round
from heterps_paddle.tools.jobs import free_port_block

A, B, C, D = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"  # D: in no hosts file
KEY = bytes(range(32))


def coordinator(lines, next_round=None, restarts=2, retries=0, checkpoint_dir=None):
    port = free_port_block(A, 1)
    job = HostsJob(
        f"{A}:{port}",
        A,
        A,
        "digest",
        {A: True, B: True},
        restarts=restarts,
        connect_retries=retries,
        file_hosts=(A, B, C),
        plan_writer=A,
        trainers={A: (0,), B: (1,)},
    )
    return Coordinator(
        job, lines.append, KEY, restarts=restarts, next_round=next_round, checkpoint_dir=checkpoint_dir, settle_s=0.2
    ).start()


def connect(endpoint, message, key=KEY):
    """A connection that proved ``key`` and sent ``message``."""
    conn, reader = control.connect_proven(endpoint, key)
    conn.sendall(json.dumps(message).encode() + b"\n")
    return conn, reader


def raw(endpoint):
    """A connection that proves nothing (a stranger), and its reader."""
    host_part, port = endpoint.rsplit(":", 1)
    conn = socket.create_connection((host_part, int(port)), timeout=10)
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
        assert ask_round(coord.job.endpoint, KEY, time.monotonic() + 5) == {
            "round": 0,
            "plan": None,
            "lost": [],
            "joined": [],
        }
        with coord.lock:
            coord.machine = replace(coord.machine, lost=frozenset({C}))  # as after a restart that lost it
        conn, reader = connect(coord.job.endpoint, {"op": "join", "host": C, "digest": "digest", "spare": True})
        assert json.loads(reader.readline())["op"] == "standby"
        wait_for(lambda: C not in coord.machine.lost, "the host back")
        assert ask_round(coord.job.endpoint, KEY, time.monotonic() + 5)["lost"] == []
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
            assert json.loads(reader.readline())["op"] == "start"
        joined[1][0].sendall(
            json.dumps({"op": "failed", "reason": "aborted", "connect_timeout": True}).encode() + b"\n"
        )
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
            assert json.loads(reader.readline())["op"] == "start"
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


def test_a_host_that_never_joins_ends_the_launch_naming_it(monkeypatch):
    """HETERPS_STARTUP_TIMEOUT past with a host of the round missing: every host that joined hears why (what a host
    whose launch never comes up costs a job: tests/test_across_hosts.py ran it launched)."""
    monkeypatch.setenv("HETERPS_STARTUP_TIMEOUT", "2")
    lines = []
    coord = coordinator(lines)
    try:
        _, first = connect(coord.job.endpoint, {"op": "join", "host": A, "digest": "digest"})
        told = next_op(first)
        assert told["op"] == "abort" and f"host {B} never joined the launch within 2 s" in told["reason"], told
        assert coord.aborted == told["reason"]
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_machine_from_outside_joins_and_a_host_leaves_at_the_next_checkpoint(tmp_path):
    """D, never in the hosts file, joins with its type; B asks to leave: the trainers are asked for a checkpoint,
    and once one is complete every host hears the new round, planned with D and without B (restarts.json: a leave,
    no restart used)."""
    lines, plans = [], []

    def next_round(request):
        plans.append(request)
        return RoundPlan({"stages": []}, replace(coord.job, members={A: True, D: False}), {"summary": "-> with D"})

    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    coord = coordinator(lines, next_round, restarts=0, checkpoint_dir=str(checkpoints))
    coord.restarts_path = str(tmp_path / "restarts.json")
    try:
        stranger, told = connect(coord.job.endpoint, {"op": "join", "host": D, "digest": "digest", "spare": True})
        assert "not a host of this launch's hosts file" in json.loads(told.readline())["reason"]
        bad = {"op": "join", "host": D, "digest": "digest", "spare": True, "joining": {"type": "gpu", "units": -1}}
        _, told = connect(coord.job.endpoint, bad)
        assert told.readline() == b""  # a bad description closes that connection, and nothing else
        # the job's published cluster (the plan record's planning inputs) names the types a machine may join as
        cluster = {"resource_types": [{"name": "cpu_small"}, {"name": "gpu_fast"}]}
        _, put = connect(
            coord.job.endpoint, {"op": "put", "key": "plan", "host": A, "value": {"inputs": {"cluster": cluster}}}
        )
        assert "error" not in json.loads(put.readline())
        tpu = {"op": "join", "host": D, "digest": "digest", "spare": True, "joining": {"type": "tpu"}}
        _, told = connect(coord.job.endpoint, tpu)
        assert "'tpu' is not a resource type of the job's cluster" in json.loads(told.readline())["reason"]
        joiner = {"op": "join", "host": D, "digest": "digest", "spare": True, "joining": {"type": "gpu_fast"}}
        _, spare = connect(coord.job.endpoint, joiner)
        assert json.loads(spare.readline())["op"] == "standby"
        said = f"host {D} (1 x gpu_fast) joined the job from outside the hosts file"
        wait_for(lambda: any(said in line for line in lines), "the console line of the join")
        members = [connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)]
        for _, reader in members:
            assert json.loads(reader.readline())["op"] == "start"
        _, answer = connect(coord.job.endpoint, {"op": "leave", "host": A, "grace_s": 30})
        assert "coordinator's host" in json.loads(answer.readline())["reason"]
        for grace in (float("nan"), float("inf"), 1e9, -1, True, "30"):  # refused: only that connection closes
            _, answer = connect(coord.job.endpoint, {"op": "leave", "host": B, "grace_s": grace})
            assert answer.readline() == b"", grace
        _, answer = connect(coord.job.endpoint, {"op": "leave", "host": B, "grace_s": 30})
        assert json.loads(answer.readline())["accepted"] is True
        asked = checkpoints / ".sync" / coord.launch_id / "asked"
        wait_for(asked.exists, "the checkpoint asked for")
        (checkpoints / "pass-000001").mkdir()  # as trainer 0's rename makes it
        for _, reader in [*members, (None, spare)]:
            told = next_op(reader)
            assert told["op"] == "restart" and told["left"] == [B] and told["lost"] == [B], told
            assert told["joined"] == [{"address": D, "type": "gpu_fast", "units": 1}], told
        assert plans[0].lost == frozenset({B}) and plans[0].joined == {D: {"type": "gpu_fast", "units": 1}}
        (event,) = json.loads((tmp_path / "restarts.json").read_text())["restarts"]
        assert event["kind"] == "leave" and event["left"] == [B] and event["lost"] == []
        assert coord.machine.round.restarts_used == 0
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


# ---- as an attacker would: a process that is not part of the job, on the same machine


def test_a_stranger_without_the_key_can_end_block_or_write_nothing():
    """Garbage, a join without the key, a join with a wrong key, a forged board write, a huge line, a half line:
    each closed, none acted on; the genuine members then join, start and end."""
    lines = []
    coord = coordinator(lines, restarts=0)
    endpoint = coord.job.endpoint
    try:
        conn, reader = raw(endpoint)
        assert json.loads(reader.readline())["op"] == "hello"  # a challenge first, nothing else
        conn.sendall(json.dumps({"op": "join", "host": A, "digest": "digest"}).encode() + b"\n")
        assert reader.readline() == b""  # closed: not a proof
        with pytest.raises(control.Unproven, match="refused this host's proof"):
            control.connect_proven(endpoint, bytes(32))  # another key
        conn, reader = raw(endpoint)
        reader.readline()
        try:
            conn.sendall(b"x" * (control.MAX_LINE + 10))  # a huge line, no newline
        except OSError:
            pass  # closed while it was still sending: what the test wants
        assert reader.readline() == b""
        half, half_reader = raw(endpoint)  # a half line: closed after AUTH_S
        half_reader.readline()
        half.sendall(b'{"op": "auth", "nonce": "ab')
        assert half_reader.readline() == b""  # closed (its 5 s to prove the key ran out), not held open
        # nothing of that reached the job: it is still joining, and the genuine hosts start and end it
        assert coord.machine.state.value == "joining" and not coord.members
        members = [connect(endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)]
        for _, reader in members:
            assert next_op(reader)["op"] == "start"
        for conn, _ in members:
            conn.sendall(json.dumps({"op": "done"}).encode() + b"\n")
        wait_for(lambda: coord.ended, "the end")
        assert sum("refused a connection" in line for line in lines) >= 3, lines
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_flood_of_unproven_connections_does_not_lock_a_host_out():
    lines = []
    coord = coordinator(lines, restarts=0)
    flood = []
    try:
        for _ in range(MAX_UNPROVEN + 100):
            try:
                flood.append(raw(coord.job.endpoint))
            except OSError:
                pass
        members = [connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)]
        for _, reader in members:
            assert next_op(reader)["op"] == "start"
        with coord.server.lock:
            unproven = sum(1 for _, proven in coord.server.connections.values() if not proven)
        assert unproven <= MAX_UNPROVEN
    finally:
        for conn, reader in flood:
            reader.close()
            conn.close()
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_members_bad_line_is_that_hosts_failure_not_a_hung_job():
    lines = []
    coord = coordinator(lines, restarts=0)
    try:
        members = {h: connect(coord.job.endpoint, {"op": "join", "host": h, "digest": "digest"}) for h in (A, B)}
        for _, reader in members.values():
            assert next_op(reader)["op"] == "start"
        members[B][0].sendall(b"[1]\n")  # a JSON value that is not an object
        told = next_op(members[A][1])
        assert told["op"] == "abort" and f"host {B}'s heterps launch sent the coordinator a bad line" in told["reason"]
        assert "not a JSON object" in told["reason"], told
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_the_board_plan_is_written_once_a_round_by_its_writer_and_records_are_bounded():
    from heterps_paddle.launch.board import MAX_BOARD, MAX_RECORD

    coord = coordinator([], restarts=0)
    try:

        def put(key, value, host):
            conn, reader = connect(coord.job.endpoint, {"op": "put", "key": key, "value": value, "host": host})
            with conn, reader:
                return json.loads(reader.readline())

        assert "written by 127.0.0.2 (stage 1's trainer 0), not 6.6.6.6" in put("plan", {"x": 1}, "6.6.6.6")["error"]
        assert put("plan", {"x": 1}, A) == {"ok": True}
        assert "written already" in put("plan", {"x": 2}, A)["error"]
        # a process of an earlier round, still stopping as this one starts: its meter is not this round's
        stale = {"op": "put", "key": "meter.1.trainer.1", "value": {"samples": 9}, "host": B, "launch": "0" * 16}
        assert "a process of another round" in coord.board.answer(stale)["error"]
        assert coord.board.answer({**stale, "launch": coord.launch_id}) == {"ok": True}
        too_big = coord.board.answer({"op": "put", "key": "big", "value": "x" * MAX_RECORD, "host": B})
        assert f"board record 'big' from {B}:" in too_big["error"] and "over" in too_big["error"]
        for i in range(MAX_BOARD // (MAX_RECORD // 2) + 1):
            answer = coord.board.answer({"op": "put", "key": f"k{i}", "value": "x" * (MAX_RECORD // 2), "host": B})
        assert "the board is full" in answer["error"]
        conn, reader = connect(coord.job.endpoint, {"op": "get", "key": "plan"})
        with conn, reader:
            assert json.loads(reader.readline()) == {"value": {"x": 1}}
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_the_data_plan_takes_a_trainers_requests_only_from_its_host_of_this_round():
    """The ``shards`` op (launch/board.py): this round's launch id, a host of the round, a trainer that host runs,
    counts and pass numbers bounded; each refusal names why, and the plan still serves the round's trainers."""
    from heterps_paddle import rendezvous

    coord = coordinator([], restarts=0)
    digest = "0" * 64
    files = [[f"f{k}:10:{digest}", f"/d/f{k}"] for k in range(2)]
    try:

        def shards(**message):
            request = {"op": "shards", "launch": coord.launch_id, "pass": 1, **message}
            conn, reader = connect(coord.job.endpoint, {k: v for k, v in request.items() if v is not None})
            with conn, reader:
                return json.loads(reader.readline())

        offer = {"do": "offer", "trainers": 2, "files": files}
        assert "error" not in shards(host=A, trainer=0, **offer)
        refused = {
            "a request without a launch id": shards(launch=None, host=A, trainer=0, do="take"),
            "a process of another round (launch 0000000000000000)": shards(
                launch="0" * 16, host=A, trainer=0, do="take"
            ),
            f"{D!r} is not a host of this round": shards(host=D, trainer=0, do="take"),
            "'None' is not a host of this round": shards(trainer=0, do="take"),
            f"{A} does not run trainer 1 (it runs 0)": shards(host=A, trainer=1, do="take"),
            f"{B} does not run trainer 0 (it runs 1)": shards(host=B, trainer=0, do="finish", shards=[files[0][0]]),
            "1000000000 trainers (the round has 2)": shards(host=B, trainer=1, **{**offer, "trainers": 10**9}),
            "offer of pass 9: the newest pass is 1": shards(host=B, trainer=1, **{**offer, "pass": 9}),
            f"pass 0 is not a number of 1..{rendezvous.MAX_PASS}": shards(host=A, trainer=0, do="take", **{"pass": 0}),
            "pass '1' is not a number": shards(host=A, trainer=0, do="take", **{"pass": "1"}),
            "pass True is not a number": shards(host=A, trainer=0, do="take", **{"pass": True}),
            f"take: 1000000 shards wanted (1..{rendezvous.MAX_WANT})": shards(host=A, trainer=0, do="take", want=10**6),
            "progress: -1 bytes": shards(host=A, trainer=0, do="progress", bytes=-1),
        }
        for why, answer in refused.items():
            assert why in answer.get("error", ""), (why, answer)
        # none of them reached the plan: it still serves the round's two trainers, each from its host
        assert "error" not in shards(host=B, trainer=1, **offer)
        taken = shards(host=A, trainer=0, do="take", want=1)
        assert [name for name, _ in taken["shards"]] == [files[0][0]], taken
        assert "error" not in shards(host=A, trainer=0, do="finish", shards=[files[0][0]])
        assert "error" not in shards(host=B, trainer=1, **{**offer, "pass": 2})  # the next pass may come
        with coord.board.data_plan_lock:
            assert sorted(coord.board.data_plan.passes) == [1, 2]
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_one_host_data_plan_has_the_same_bounds(tmp_path, monkeypatch):
    """rendezvous.FileBoard: the launch's trainers as Paddle's launcher told them, pass numbers and counts bounded."""
    from heterps_paddle import rendezvous

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    board = rendezvous.FileBoard(str(tmp_path))
    offer = {"do": "offer", "pass": 1, "trainers": 2, "trainer": 0, "files": [["f", "/d/f"]]}
    assert "error" not in board.shards(offer)
    for message, why in (
        ({**offer, "trainers": 10**9}, "1000000000 trainers (the round has 2)"),
        ({**offer, "trainer": 5}, "trainer 5 is not one of the round's"),
        ({**offer, "pass": 3}, "offer of pass 3: the newest pass is 1"),
        ({**offer, "pass": -1}, "pass -1 is not a number"),
        ({"do": "take", "pass": 1, "trainer": 0, "want": 0}, "0 shards wanted"),
        ({"do": "finish", "pass": 1, "trainer": 0, "shards": ["f"] * (rendezvous.MAX_NAMES + 1)}, "shards, over"),
    ):
        with pytest.raises(rendezvous.RendezvousError, match=re.escape(why)):
            board.shards(message)
    assert board.shards({"do": "take", "pass": 1, "trainer": 0})  # the plan goes on
    assert "error" not in board.shards({**offer, "trainer": 1, "files": []})


def test_console_lines_come_only_from_proven_members_and_are_escaped():
    lines = []
    coord = coordinator(lines)
    try:
        conn, reader = connect(coord.job.endpoint, {"op": "log", "host": B})
        conn.sendall(b"progress \x1b[31mred\x1b[0m \x07bell\n")
        wait_for(lambda: any("progress" in line for line in lines), "the line")
        line = next(line for line in lines if "progress" in line)
        assert "\x1b" not in line and "\x07" not in line and "\\x1b[31mred" in line, line
        stranger, stranger_reader = raw(coord.job.endpoint)
        stranger.sendall(json.dumps({"op": "log", "host": B}).encode() + b"\nFORGED\n")
        assert stranger_reader.readline().startswith(b'{"op": "hello"')
        assert stranger_reader.readline() == b""
        time.sleep(0.3)
        assert not any("FORGED" in line for line in lines), lines
        reader.close()
        conn.close()
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_a_spare_must_be_a_host_of_the_file_with_the_same_files():
    lines = []
    coord = coordinator(lines)
    try:
        for host, digest, why in (
            ("127.0.0.9", "digest", "is not a host of this launch's hosts file"),
            (C, "other", "was given another plan or hosts file"),
        ):
            conn, reader = connect(coord.job.endpoint, {"op": "join", "host": host, "digest": digest, "spare": True})
            with conn, reader:
                told = json.loads(reader.readline())
                assert told["op"] == "abort" and why in told["reason"], told
        assert not coord.spares
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


def test_the_control_benchmark_runs_and_decides_a_restart(capsys):
    """``heterps bench control`` at a small scale: it measures (no time is asserted), and each of its two jobs, quiet
    and knocked, joins every member and decides a restart for the hosts left."""
    from conftest import run_cli

    code, out, err = run_cli(
        capsys, "bench", "control", "--members", "6", "--knockers", "20", "--beat-s", "1", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    for name in ("quiet", "knocked"):
        run = result[name]
        assert run["joined"] == 6 and run["members_told_restart"] == 5 and run["decided"], run
    assert result["knocked"]["unproven_knocks"] > 0 and result["knocked"]["refused_connections"] > 0


def test_an_adaptive_move_runs_the_plan_decided_on_the_correction_it_was_decided_on():
    """The machine's Replan carries the decided proposal and its correction; the coordinator hands both to the
    re-planning as they are (it keeps no correction of its own: a reconsideration whose thread outlasted the
    decision once left a later one, and the move ran another plan than the one decided, busy run of 20b6432)."""
    from heterps_paddle.launch import machine as m

    requests = []

    def next_round(request):
        requests.append(request)
        return RoundPlan({"stages": []}, coord.job, {"summary": "moved", "how": "decided"})

    decided_refit, later = object(), object()
    coord = coordinator([], next_round)
    try:
        decided = m.Proposal({"stages": ["decided"]}, "a -> b", 2.0, 1.0, True, 1.0, 2.0, correction=decided_refit)
        coord._replan(m.Replan(frozenset(), m.Kind.ADAPT, decided=decided, refit=decided_refit))
        assert requests[-1].decided is decided and requests[-1].refit is decided_refit and requests[-1].adapt
        coord._replan(m.Replan(frozenset(), m.Kind.RESTART, refit=later))  # a restart plans on the job's newest
        assert requests[-1].refit is later and requests[-1].decided is None and not requests[-1].adapt
        assert not hasattr(coord, "refit") and not hasattr(coord, "windows")  # job state is the machine's
    finally:
        coord.close(wait_s=0.1, late_joiners_s=0.0)


def test_an_on_scale_command_that_fails_or_hangs_is_bounded_logged_and_never_the_jobs(tmp_path, monkeypatch):
    from heterps_paddle.launch import coordinator as coordinator_module
    from heterps_paddle.launch.event_log import EventLog, JobLog, read

    records, said = JobLog(EventLog(str(tmp_path)), "job"), []
    message = {"wanted": {"cpu_small": 1}, "released": {}, "why": "a slow host"}
    coordinator_module.run_on_scale("cat > /dev/null; echo no quota >&2; exit 3", message, records, said.append)
    monkeypatch.setattr(coordinator_module, "ON_SCALE_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "child.pid"
    # it hangs, and what it started hangs with it: both stopped once its time is up
    coordinator_module.run_on_scale(f"sleep 300 & echo $! > {pid_file}; wait", message, records, said.append)
    ran = [r for r in read(str(tmp_path)) if r["type"] == "on_scale_ran"]
    assert ran[0]["code"] == 3 and "no quota" in ran[0]["output"]
    assert ran[1]["code"] is None and "still running after 1 s: stopped" in ran[1]["output"]
    assert said[0] == "heterps launch: adapt: --on-scale FAILED (exit status 3); the job goes on"
    assert "FAILED (still running after 1 s: stopped)" in said[1]
    child = int(pid_file.read_text())

    def running():  # a zombie (exited, not yet reaped by whatever adopted it) is not running
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(), f"the hung command's child {child} is still running"


def test_one_reconsideration_plans_at_a_time_and_none_before_the_plan_is_published():
    """A reconsideration before trainer 0 published its plan plans nothing and says nothing false (a budgeted job's
    first one said "the job published no planning inputs" while trainer 0 waited for a host's type to be measured);
    while one plans, the next is dropped (under a budget each took minutes of rl, and their threads piled up beside
    the job's training)."""
    import threading

    from heterps_paddle.launch import machine as m

    calls, release = [], threading.Event()

    def propose(request, windows, why):
        calls.append(why)
        release.wait(10)
        return None

    lines = []
    coord = coordinator(lines)
    coord.propose = propose
    kept = []

    class Records:  # the job's records the coordinator writes (launch/event_log.py: JobLog), kept
        def write(self, kind, **fields):
            kept.append((kind, fields))

        def actions(self, actions, job):
            pass

    coord.records = Records()
    try:
        coord._reconsider(m.Reconsider("before the plan", False, (), None))
        assert kept == [
            ("proposed", {"proposal": None, "detail": "not planned: trainer 0 has not published its plan yet"})
        ]
        assert calls == [] and not [line for line in lines if "no planning inputs" in line], lines
        record = {"op": "put", "key": "plan", "host": A, "value": {"plan": {"stages": []}, "inputs": {"any": 1}}}
        assert "error" not in coord.board.answer(record)
        coord._reconsider(m.Reconsider("first", False, (), None))
        coord._reconsider(m.Reconsider("second, while the first plans", False, (), None))
        wait_for(lambda: calls == ["first"], "the first reconsideration planning")
        assert kept[-1][1]["detail"] == "not planned: the reconsideration asked for before is still planning"
        release.set()
        coord.reconsidering.join(10)
        coord._reconsider(m.Reconsider("third, once it is done", False, (), None))
        wait_for(lambda: calls == ["first", "third, once it is done"], "the third reconsideration planning")
    finally:
        release.set()
        coord.close(wait_s=0.1, late_joiners_s=0.0)
