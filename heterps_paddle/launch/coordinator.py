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
import socket
import socketserver
import threading
import time
import uuid
from typing import Any, BinaryIO, Callable, Mapping, cast

from heterps_paddle import control
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic
from heterps_paddle.launch import machine as m
from heterps_paddle.launch.job import HostsJob, JobAborted, RoundPlan, RoundRequest, host_timeout, startup_timeout
from heterps_paddle.launch.leave import MAX_GRACE_S
from heterps_paddle.planning.hosts import joined_spec
from heterps_paddle.rendezvous import BoardStore
from heterps_paddle.runtime.checkpoint_choice import ask_checkpoint, choose, listed

SETTLE_S = 5.0  # after a failure, what else is lost: a host's death fails its peers' processes within seconds
WATCH_S = 1.0
MAX_UNPROVEN = 512  # connections still to prove the key: a newer one drops the oldest (a flood cannot lock hosts out)
MAX_CONNECTIONS = 1024  # in all; past it the oldest unproven one is dropped, or the new one when none is unproven
MAX_RECORD = control.MAX_LINE  # a board record (one line)
MAX_BOARD = 16 << 20  # the board, all records together
REFUSALS_SAID = 20  # unproven connections named on the console, then only counted (a flood must not flood it)


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters and escape sequences shown escaped, never interpreted."""
    return "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in text)


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
                control.send(self.wfile, message)
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
        key: bytes,
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
            file_hosts=frozenset(job.file_hosts),
            files_digest=job.digest,
        )
        self.key = key
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
        # every open connection -> when it came and whether it proved the key (the cap drops unproven ones first)
        self.connections: dict[socket.socket, tuple[float, bool]] = {}
        self.connections_lock = threading.Lock()
        self.refused = 0  # connections that did not prove the key

    # ---- serving

    def start(self) -> Coordinator:
        coordinator = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                coordinator.serve(self.request, cast(BinaryIO, self.rfile), self.wfile, self.client_address)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            request_queue_size = 1024  # a flood of connections must not crowd a host's out of the accept queue

            def verify_request(self, request: Any, client_address: Any) -> bool:
                return coordinator._admit(request)

            def shutdown_request(self, request: Any) -> None:
                coordinator._forget(request)
                super().shutdown_request(request)

        host, port = self.job.endpoint.rsplit(":", 1)
        try:
            self.server = Server((host, int(port)), Handler)
        except OSError as exc:
            raise JobAborted(
                f"cannot serve the launch's coordinator on {self.job.endpoint} ({exc}): is another launch of this "
                "hosts file running, or is control_port taken on this host?"
            ) from None
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

    # ---- connections: every one proves the job's key first, and is read with bounds (heterps_paddle/control.py)

    def _admit(self, conn: socket.socket) -> bool:
        """A new connection, within the caps: the oldest unproven one makes room, never a proven one."""
        with self.connections_lock:
            unproven = sorted((at, c) for c, (at, proven) in self.connections.items() if not proven)
            if len(unproven) >= MAX_UNPROVEN or len(self.connections) >= MAX_CONNECTIONS:
                if not unproven:
                    return False
                _drop(unproven[0][1])
                self.connections.pop(unproven[0][1], None)
            self.connections[conn] = (time.monotonic(), False)
        return True

    def _forget(self, conn: socket.socket) -> None:
        with self.connections_lock:
            self.connections.pop(conn, None)

    def serve(self, conn: socket.socket, rfile: BinaryIO, wfile: Any, address: Any) -> None:
        """One connection: the proof of the key within AUTH_S seconds, then its first request.  Whatever goes wrong
        in one peer's handling closes that peer's connection and nothing else."""
        proven = False
        try:
            conn.settimeout(control.AUTH_S)
            control.challenge(self.key, rfile, wfile)
            proven = True
            with self.connections_lock:
                if conn in self.connections:
                    self.connections[conn] = (self.connections[conn][0], True)
            first = control.read_message(rfile)
            if first is None:
                return
            self.handle(first, conn, rfile, wfile)
        except (control.Unproven, OSError, ValueError) as exc:
            if not proven:
                self._refused(address, exc)
            elif isinstance(exc, control.Unproven):
                self.say(f"heterps launch: closed a connection from {address[0]}: {printable(str(exc))}")
        except Exception as exc:  # a bug must close this peer, never end the coordinator's thread silently
            what = printable(f"{type(exc).__name__}: {exc}")
            self.say(f"heterps launch: the coordinator closed a connection from {address[0]}: {what}")

    def _refused(self, address: Any, exc: BaseException) -> None:
        with self.connections_lock:
            self.refused += 1
            count = self.refused
        if count <= REFUSALS_SAID:
            what = printable(str(exc) or type(exc).__name__)
            self.say(f"heterps launch: refused a connection from {address[0]} to the control port: {what}")
            if count == REFUSALS_SAID:
                self.say("heterps launch: (further refused connections are counted, not shown)")

    # ---- requests

    def handle(self, first: Mapping[str, Any], conn: socket.socket, rfile: BinaryIO, wfile: Any) -> None:
        """A proven peer's first request."""
        op = first.get("op")
        if op == "round":
            with self.lock:
                answer = {
                    "round": self.machine.round.number,
                    "plan": self.machine.round.plan,
                    "lost": sorted(self.machine.lost),
                    "joined": [{"address": h, **spec} for h, spec in self.machine.extra.items()],
                }
            control.send(wfile, answer)
        elif op == "join":
            host = first.get("host")
            if not isinstance(host, str) or not isinstance(first.get("digest"), str):
                raise control.Unproven("a join without a host and a digest")
            conn.settimeout(self.host_timeout + control.AUTH_S)  # members beat every BEAT_S: silence is a loss
            if first.get("spare"):
                joining = first.get("joining")
                if joining is not None:  # a machine from outside the hosts file says what it is
                    joining = joined_spec(host, joining, f"the join of {printable(host)}")
                    refusal = self._unknown_type(joining)
                    if refusal:
                        control.send(wfile, {"op": "abort", "reason": refusal})
                        return
                self._spare(host, str(first["digest"]), Peer(host, wfile, -1), rfile, joining)
            else:
                self._member(host, str(first["digest"]), rfile, wfile)
        elif op == "leave":
            host, grace = first.get("host"), first.get("grace_s")
            if not isinstance(host, str) or isinstance(grace, bool) or not isinstance(grace, (int, float)):
                raise control.Unproven("a leave without a host, or without a grace time in seconds")
            if not 0 <= grace <= MAX_GRACE_S:  # NaN and infinities too
                raise control.Unproven(f"a leave's grace time must be 0..{MAX_GRACE_S:.0f} s")
            with self.lock:
                event = m.LeaveAsked(host, float(grace), newest_checkpoint(self.checkpoint_dir))
                self._feed(event, Peer(host, wfile, -2))
        elif op == "log":
            conn.settimeout(None)  # a console stream may be quiet for as long as the job
            host = printable(str(first.get("host", "?")))
            while True:
                raw = control.read_line(rfile)
                if not raw:
                    return
                self.say(f"[{host}] {printable(raw.decode('utf-8', 'replace').rstrip())}")
        else:
            control.send(wfile, self._board(first))

    def _board(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A board request: the plan record is written once a round, by stage 1's trainer 0's host; every record
        and the board as a whole are bounded."""
        op = message.get("op")
        if op == "put":
            key, host = message.get("key"), message.get("host")
            if key == "plan":
                with self.lock:
                    writer, written = self.job.plan_writer, self.store.answer({"op": "get", "key": "plan"})["value"]
                if host != writer:
                    return {"error": f"the plan record is written by {writer} (stage 1's trainer 0), not {host}"}
                if written is not None:
                    return {"error": f"the plan record of this round was written already (refused from {host})"}
            size = len(json.dumps(message.get("value")))
            if size > MAX_RECORD:
                return {"error": f"board record {key!r} from {host}: {size} bytes, over {MAX_RECORD}"}
            if self.store.size() + size > MAX_BOARD:
                return {"error": f"board record {key!r} from {host}: the board is full ({MAX_BOARD} bytes)"}
        try:
            return self.store.answer(message)
        except (KeyError, HeterPSError) as exc:
            return {"error": str(exc)}

    def _unknown_type(self, joining: Mapping[str, Any]) -> str | None:
        """Why a joining machine's type cannot be planned on (None: it can): not a type of the cluster the job's
        plan was made on (its published planning inputs), when the job published them."""
        inputs = self.store.answer({"op": "get", "key": "plan"}).get("value") or {}
        cluster = (inputs.get("inputs") or {}).get("cluster") or {}
        types = [t.get("name") for t in cluster.get("resource_types") or () if isinstance(t, Mapping)]
        if types and joining["type"] not in types:
            return f"type {printable(str(joining['type']))!r} is not a resource type of the job's cluster ({', '.join(map(str, types))})"
        return None

    def _spare(
        self, host: str, digest: str, peer: Peer, rfile: BinaryIO, joining: Mapping[str, Any] | None = None
    ) -> None:
        """A host that runs nothing of this round's plan: told of a restart (whose plan may use it) and of the end.
        ``joining``: a machine from outside the hosts file, as it said what it is."""
        with self.lock:
            event = m.SpareJoined(host, digest, newest_checkpoint(self.checkpoint_dir), joining)
            self._feed(event, peer)
        if peer.gone:
            return  # refused, or told the job's end
        try:
            while control.read_message(rfile) is not None:  # beats
                peer.last_seen = time.monotonic()
        except (OSError, control.Unproven):
            pass
        with self.lock:
            peer.gone = True
            if self.spares.get(host) is peer:  # not told to go (that lets it go first)
                del self.spares[host]
                self._feed(m.SpareGone(host))

    def _member(self, host: str, digest: str, rfile: BinaryIO, wfile: Any) -> None:
        with self.lock:
            peer = Peer(host, wfile, self.machine.round.number)
            self._feed(m.Joined(host, digest), peer)
        if peer.gone:
            return  # refused
        why = ""
        try:
            while True:
                message = control.read_message(rfile)
                if message is None:
                    break
                peer.last_seen = time.monotonic()
                event = _member_event(host, peer.round, message)
                with self.lock:
                    if peer.round != self.machine.round.number:
                        break  # a host of an earlier round: it starts again, or was dropped
                    if event is not None:
                        self._feed(event)
        except control.Unproven as exc:
            why = f"sent the coordinator a bad line ({exc}): its connection was closed"
        except TimeoutError:
            why = f"sent no whole line for {self.host_timeout + control.AUTH_S:.0f} s: its connection was closed"
        except OSError:
            pass
        with self.lock:
            peer.gone = True
            self._feed(m.HostGone(host, peer.round, printable(why)))

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
        if peer.round == -2 or any(isinstance(action, m.Refuse) for action in actions):
            return  # a one-shot request (a leave), or refused
        if peer.round == -1:
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
        elif isinstance(action, m.LetGo):
            let_go = self.spares.pop(action.host, None) or self.peers.get(action.host)
            if let_go is not None:
                let_go.send(action.message)
                let_go.gone = True
        elif isinstance(action, m.AskCheckpoint):
            if self.checkpoint_dir is not None:
                path = ask_checkpoint(self.checkpoint_dir, self.launch_id, action.reason)
                self.say(f"heterps launch: asked the trainers for a checkpoint at the end of the pass ({path})")
        elif isinstance(action, m.Replan):
            return self._replan(action.lost, action.joined)
        elif isinstance(action, m.NextRound):
            self._next_round(action)
        return None

    def _let_spares_go(self, message: Mapping[str, Any]) -> None:
        for each in self.spares.values():
            each.send(message)
            each.gone = True
        self.spares = {}

    def _replan(self, lost: frozenset[str], joined: Mapping[str, Mapping[str, Any]]) -> m.Event:
        """The next round's plan for the hosts the job has, those of the file and ``joined``, less ``lost``
        (launch/rounds.py)."""
        assert self.next_round is not None
        job = self.machine
        published = self.store.answer({"op": "get", "key": "plan"}).get("value") or {}
        request = RoundRequest(
            lost,
            job.round.lost,
            published,
            job.round.plan,
            job.round.number + 1,
            joined={h: dict(spec) for h, spec in joined.items() if h not in lost},
            joined_before=job.round.joined,
        )
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
                if (self.machine.back or self.machine.leaving) and self.checkpoint_dir is not None:
                    self._feed(m.CheckpointComplete(newest_checkpoint(self.checkpoint_dir)))
                self._feed(m.Tick())


def _member_event(host: str, number: int, message: Mapping[str, Any]) -> m.Event | None:
    """What a member's line says (None: a beat); Unproven for a line a member does not send."""
    op = message.get("op")
    if op == "beat":
        return None
    if op == "done":
        return m.Done(host, number)
    if op == "failed":
        reason, retryable = message.get("reason"), message.get("retryable", False)
        if not isinstance(reason, str) or not isinstance(retryable, bool):
            raise control.Unproven("a 'failed' line without a reason (text) or with a retryable that is not true/false")
        return m.ProcessFailed(host, number, printable(reason), retryable)
    raise control.Unproven(f"an op a member does not send ({printable(str(op))[:40]!r})")


def _drop(conn: socket.socket) -> None:
    """End a connection another thread reads: its read returns, and its handler ends."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


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
