"""The coordinator of a launch across hosts: the shell that carries out the job's state machine (launch/machine.py).

It runs inside ``heterps launch`` on server 0's host, on the hosts file's ``control_port`` (planning/hosts.py), and
serves the launch's board (rendezvous.py: the plan every process runs, the side channels' endpoints, the checkpoint
the servers restored) and the job's membership.  Every decision is the machine's: this module turns what it sees
(a join, a member's line, a closed connection, a silent host, the newest checkpoint, the clock) into events, and
the machine's actions into messages, console lines, re-planning and ``restarts.json``.  One lock orders it all.

The other hosts' launches send their console lines (the job's progress, their own messages) here, and the
coordinator prints them with the host's address.
"""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
import uuid
from typing import Any, Callable, Mapping

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic
from heterps_paddle.launch import machine as m
from heterps_paddle.launch.job import HostsJob, JobAborted, RoundPlan, RoundRequest, host_timeout, startup_timeout
from heterps_paddle.rendezvous import BoardStore
from heterps_paddle.runtime.checkpoint_choice import choose, listed

SETTLE_S = 5.0  # after a failure, what else is lost: a host's death fails its peers' processes within seconds
WATCH_S = 1.0


class Peer:
    """One connection of a host, as the coordinator holds it: a member of ``round``, or a spare."""

    def __init__(self, host: str, wfile: Any, round_number: int):
        self.host = host
        self.wfile = wfile
        self.round = round_number
        self.lock = threading.Lock()
        self.last_seen = time.monotonic()
        self.gone = False

    def send(self, message: Mapping[str, Any]) -> None:
        with self.lock:
            if self.gone:
                return
            try:
                self.wfile.write(json.dumps(message).encode() + b"\n")
                self.wfile.flush()
            except OSError:
                self.gone = True


def first_round(job: HostsJob) -> m.Round:
    return m.Round(0, dict(job.members), job.coordinator, job.digest)


class Coordinator:
    """The launch's coordinator (module doc).  ``say`` prints a line on this host's console; ``next_round`` plans a
    new round (launch/rounds.py; without it any failure ends the launch); every change of round is written to
    ``restarts_path``."""

    def __init__(
        self,
        job: HostsJob,
        say: Callable[[str], None],
        restarts: int = 0,
        next_round: Callable[[RoundRequest], RoundPlan] | None = None,
        restarts_path: str | None = None,
        checkpoint_dir: str | None = None,
        settle_s: float = SETTLE_S,
    ):
        self.job = job  # this host's part of the running round
        self.say = say
        self.next_round = next_round
        self.restarts_path = restarts_path
        self.checkpoint_dir = checkpoint_dir
        rules = m.Rules(
            restarts=restarts,
            connect_retries=job.connect_retries,
            settle_s=settle_s,
            startup_s=startup_timeout(),
            can_replan=next_round is not None,
            checkpoints=checkpoint_dir is not None,
        )
        self.machine = m.first_job(rules, first_round(job), time.monotonic())
        self.planned: RoundPlan | None = None  # the plan a NextRound action starts
        self.store = BoardStore()
        self.launch_id = uuid.uuid4().hex[:16]
        self.peers: dict[str, Peer] = {}  # this round's hosts that joined (or were refused after its start)
        self.spares: dict[str, Peer] = {}
        self.started = False  # this round started (every host joined)
        self.lock = threading.Lock()
        self.host_timeout = host_timeout()
        self.server: socketserver.ThreadingTCPServer | None = None
        self._stop = threading.Event()

    # ---- serving

    def start(self) -> Coordinator:
        coordinator = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                coordinator.handle(self.rfile, self.wfile)

        host, port = self.job.endpoint.rsplit(":", 1)
        socketserver.ThreadingTCPServer.allow_reuse_address = True
        try:
            self.server = socketserver.ThreadingTCPServer((host, int(port)), Handler)
        except OSError as exc:
            raise JobAborted(
                f"cannot serve the launch's coordinator on {self.job.endpoint} ({exc}): is another launch of this "
                "hosts file running, or is control_port taken on this host?"
            ) from None
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="heterps-coordinator", daemon=True).start()
        threading.Thread(target=self._watch, name="heterps-coordinator-watch", daemon=True).start()
        return self

    def close(self, wait_s: float = 15.0, late_joiners_s: float = 30.0) -> None:
        """Stop serving once every member has gone (or after ``wait_s``): the last messages must reach them.  A
        launch that ended before it started waits a while more (``late_joiners_s``, at most until the startup
        deadline) for the hosts that had not joined yet, so that they too hear why, rather than wait for a
        coordinator that is gone."""
        now = time.monotonic()
        deadline = now + wait_s
        with self.lock:
            if self.machine.state is m.JobState.ABORTED and not self.started:
                deadline = max(deadline, min(self.machine.startup_deadline, now + late_joiners_s))
        while time.monotonic() < deadline:
            with self.lock:
                told = all(h in self.peers for h in self.job.members) or self.started
                if told and all(peer.gone for peer in self.peers.values()):
                    break
            time.sleep(0.1)
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def ended(self) -> bool:
        return self.machine.state is m.JobState.ENDED

    @property
    def aborted(self) -> str | None:
        return self.machine.reason if self.machine.state is m.JobState.ABORTED else None

    # ---- requests

    def handle(self, rfile: Any, wfile: Any) -> None:
        try:
            first = json.loads(rfile.readline() or b"null")
        except ValueError:
            return
        if not isinstance(first, dict):
            return
        op = first.get("op")
        if op == "round":
            with self.lock:
                answer = {
                    "round": self.machine.round.number,
                    "plan": self.machine.round.plan,
                    "lost": sorted(self.machine.lost),
                }
            wfile.write(json.dumps(answer).encode() + b"\n")
        elif op == "join" and first.get("spare"):
            self._spare(str(first.get("host")), Peer(str(first.get("host")), wfile, -1), rfile)
        elif op == "join":
            self._member(first, rfile, wfile)
        elif op == "log":
            host = str(first.get("host", "?"))
            for raw in iter(rfile.readline, b""):
                self.say(f"[{host}] {raw.decode('utf-8', 'replace').rstrip()}")
        else:
            try:
                wfile.write(json.dumps(self.store.answer(first)).encode() + b"\n")
            except (KeyError, HeterPSError) as exc:
                wfile.write(json.dumps({"error": str(exc)}).encode() + b"\n")

    def _spare(self, host: str, peer: Peer, rfile: Any) -> None:
        """A host that runs nothing of this round's plan: told of a restart (whose plan may use it) and of the end."""
        with self.lock:
            event = m.SpareJoined(host, newest_checkpoint(self.checkpoint_dir))
            self._feed(event, peer)
        try:
            for _ in iter(rfile.readline, b""):
                peer.last_seen = time.monotonic()
        except OSError:
            pass
        with self.lock:
            peer.gone = True
            if self.spares.get(host) is peer:  # not told to go (that lets it go first)
                del self.spares[host]
                self._feed(m.SpareGone(host))

    def _member(self, first: Mapping[str, Any], rfile: Any, wfile: Any) -> None:
        host = str(first.get("host"))
        with self.lock:
            peer = Peer(host, wfile, self.machine.round.number)
            self._feed(m.Joined(host, str(first.get("digest"))), peer)
        if peer.gone:
            return  # refused
        try:
            for raw in iter(rfile.readline, b""):
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                peer.last_seen = time.monotonic()
                op = message.get("op")
                with self.lock:
                    if peer.round != self.machine.round.number:
                        break  # a host of an earlier round: it starts again, or was dropped
                    if op == "failed":
                        reason, retryable = str(message.get("reason")), bool(message.get("retryable"))
                        self._feed(m.ProcessFailed(host, peer.round, reason, retryable))
                    elif op == "done":
                        self._feed(m.Done(host, peer.round))
        except OSError:
            pass
        with self.lock:
            peer.gone = True
            self._feed(m.HostGone(host, peer.round))

    # ---- the machine

    def _feed(self, event: m.Event, peer: Peer | None = None) -> None:
        """With the lock held: ``event`` through the machine, and its actions carried out (``peer``: the connection
        the event came on, for the answers meant for it)."""
        queue: list[m.Event] = [event]
        while queue:
            self.machine, actions = m.step(self.machine, queue.pop(0), time.monotonic())
            if peer is not None:
                self._register(peer, actions)
            for action in actions:
                follow = self._carry_out(action, peer)
                if follow is not None:
                    queue.append(follow)
            peer = None

    def _register(self, peer: Peer, actions: list[m.Action]) -> None:
        """A joining connection the machine took: it hears what the round's hosts hear from now on."""
        if any(isinstance(action, m.Refuse) for action in actions):
            return
        if peer.round < 0:
            if peer.host in self.machine.spares:
                self.spares[peer.host] = peer
        elif peer.host in self.machine.joined:
            self.peers[peer.host] = peer

    def _carry_out(self, action: m.Action, peer: Peer | None) -> m.Event | None:
        if isinstance(action, m.Say):
            self.say(action.text)
        elif isinstance(action, m.Refuse):
            assert peer is not None
            peer.send({"op": "abort", "reason": action.reason})
            peer.gone = True
            if action.host in self.job.members:
                self.peers.setdefault(action.host, peer)  # it heard why: close() need not wait for it
        elif isinstance(action, m.Reply):
            assert peer is not None
            peer.send(action.message)
            if action.message.get("op") != "standby":
                peer.gone = True
        elif isinstance(action, m.Start):
            self.started = True
            self.say(
                f"heterps launch: every host joined ({', '.join(action.hosts)}; plan and placement digest "
                f"{action.digest}); the job starts"
            )
            for each in self.peers.values():
                each.send({"op": "start", "launch_id": self.launch_id})
        elif isinstance(action, m.Beat):
            for each in self.peers.values():
                each.send({"op": "beat"})
        elif isinstance(action, m.Tell):
            for each in self.peers.values():
                each.send(action.message)
            if action.spares:
                self._let_spares_go(action.message)
        elif isinstance(action, m.Replan):
            return self._replan(action.lost)
        elif isinstance(action, m.NextRound):
            self._next_round(action)
        return None

    def _let_spares_go(self, message: Mapping[str, Any]) -> None:
        for each in self.spares.values():
            each.send(message)
            each.gone = True
        self.spares = {}

    def _replan(self, lost: frozenset[str]) -> m.Event:
        """The next round's plan for the hosts the job has, every host but ``lost`` (launch/rounds.py)."""
        assert self.next_round is not None
        job = self.machine
        published = self.store.answer({"op": "get", "key": "plan"}).get("value") or {}
        request = RoundRequest(lost, job.round.lost, published, job.round.plan, job.round.number + 1)
        try:
            planned = self.next_round(request)
        except HeterPSError as exc:
            return m.PlanFailed(str(exc), expected=True)
        except Exception as exc:  # a bug in re-planning must still end the job, loudly, on every host
            return m.PlanFailed(f"{type(exc).__name__}: {exc}", expected=False)
        self.planned = planned
        return m.Planned(
            plan=planned.plan,
            members=planned.job.members,
            coordinator=planned.job.coordinator,
            digest=planned.job.digest,
            report=planned.report,
            # the newest complete checkpoint as the round is decided: the next round resumes from it (unless a save
            # that was finishing as the hosts stopped overtakes it; each host's console says which it took)
            checkpoint=checkpoint_report(self.checkpoint_dir),
            at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            better=planned.better,
        )

    def _next_round(self, action: m.NextRound) -> None:
        """Every host told to stop and start again with the new round's plan (a restart, a retry or a move)."""
        assert self.planned is not None
        if self.restarts_path is not None:
            write_atomic(self.restarts_path, json.dumps({"restarts": list(action.history)}, indent=2) + "\n")
        for each in self.peers.values():
            each.send(action.message)
            each.gone = True  # its connection ends with this round
        self._let_spares_go(action.message)
        self.job = self.planned.job
        self.planned = None
        self.peers = {}
        self.started = False
        self.launch_id = uuid.uuid4().hex[:16]
        self.store = BoardStore()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            with self.lock:
                if self.machine.state.over:
                    continue
                now = time.monotonic()
                if self.started:
                    for peer in list(self.peers.values()):
                        if not peer.gone and now - peer.last_seen > self.host_timeout:
                            self._feed(m.HostSilent(peer.host, peer.round, self.host_timeout))
                if self.machine.back and self.checkpoint_dir is not None:
                    self._feed(m.CheckpointComplete(newest_checkpoint(self.checkpoint_dir)))
                self._feed(m.Tick())


def newest_checkpoint(root: str | None) -> int:
    """The passes of the newest complete checkpoint the launch wrote under ``root`` (0: none).  Complete: its
    directory has its final name only once its manifest is written (runtime/launch_checkpoints.py)."""
    return next((passes for passes, _ in listed(root)), 0) if root else 0


def checkpoint_report(root: str | None) -> dict[str, Any]:
    """For restarts.json: the checkpoint a new round resumes from, and the training since it (redone)."""
    if root is None:
        return {"resumes_from": None, "work_redone": "everything: the launch keeps no checkpoints (--checkpoint-dir)"}
    choice = choose(root)
    if choice.path is None:
        return {"resumes_from": None, "work_redone": "everything: no complete checkpoint yet"}
    try:
        since = time.time() - os.stat(choice.path).st_mtime
    except OSError:
        since = float("nan")
    return {
        "resumes_from": choice.path,
        "passes_done": choice.passes_done,
        "work_redone": f"the training since that checkpoint ({since:.0f} s; passes after pass {choice.passes_done})",
    }
