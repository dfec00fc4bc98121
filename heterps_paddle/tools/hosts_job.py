"""A launch across hosts: one coordinator, and every host's ``heterps launch --hosts`` a member of it.

Paddle 2.6.2's PS launcher knows only its own host: it ignores every exit status, a host with only servers waits
on them forever, and a host whose trainers end stops its servers even while another host's trainers still use
them.  So ``heterps launch --hosts`` runs the launch as one job:

- **The coordinator** runs inside ``heterps launch`` on server 0's host, on the hosts file's ``control_port``
  (planning/hosts.py).  It serves the launch's board (rendezvous.py: the plan every process runs, the side
  channels' endpoints, the checkpoint the servers restored) and the job's membership.
- **Joining.**  Each host's launch (the process that runs Paddle's launcher) joins with the digest of the plan
  and placement it was given (``Expansion.digest``).  Nothing starts anywhere until every host that runs a
  process of the plan has joined with the same digest; a host with another plan, or one that never joins within
  ``HETERPS_STARTUP_TIMEOUT``, ends the launch on every host before any process starts, naming the host.
- **Supervision.**  A host whose supervisor sees a process fail says so; a host whose launch goes away (its
  connection closes: the process was killed, or the machine died) or stops answering for ``HETERPS_HOST_TIMEOUT``
  seconds is lost.  Either way the coordinator tells every host to stop, with the reason, and each host stops its
  processes and exits non-zero.
- **The end.**  A host whose CPU trainers finished says so and keeps its servers and heterogeneous trainers
  serving; when every host with CPU trainers has finished, the coordinator tells every host the job ended, and
  each stops what it still runs and exits 0.
- **One console.**  The other hosts' launches send their console lines (the job's progress, their own messages)
  to the coordinator's host, which prints them with the host's address.

- **A host back.**  With ``--restarts``, a lost host whose ``heterps launch`` is started again asks the coordinator
  which round the job is in (``round``), stands by, and is counted back: at the next complete checkpoint the
  coordinator re-plans with it and, when that plan is better (planning/replan.py: ``better``), every host moves to
  it, resuming from that checkpoint.  A move is not a restart: it does not use up ``--restarts``.
- **A retry.**  When the first failure is Paddle's connect-timeout abort (tools/paddle_aborts.py: a busy machine,
  not a lost peer), the coordinator starts a round with the same plan on the same hosts, even with ``--restarts 0``
  (``HETERPS_CONNECT_RETRIES`` times; it does not use up ``--restarts``).  So a host whose process failed waits for
  the coordinator's word (``HostsJob.may_start_again``); any other failure is answered with an abort at once.

The protocol is JSON lines over TCP: ``join`` / ``beat`` / ``failed`` / ``done`` from a member, ``start`` /
``beat`` / ``abort`` / ``end`` / ``restart`` from the coordinator; ``log`` opens a stream of console lines;
``round``, ``put`` / ``get`` / ``entries`` are one-shot requests (the job's round; the board).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import socketserver
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, cast

from heterps_paddle import settings
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic
from heterps_paddle.rendezvous import BoardStore

JOB_ENV = "HETERPS_HOSTS_JOB"  # the launch's HostsJob, from heterps launch to the process that runs Paddle's launcher
RESTART_FILE_ENV = "HETERPS_RESTART_FILE"  # where that process leaves a restart's message for heterps launch
RESTART_EXIT = 75  # that process's exit status when the job starts again (a new round)
BEAT_S = 2.0
SETTLE_S = 5.0  # after a failure, what else is lost: a host's death fails its peers' processes within seconds
JOIN_RETRY_S = 0.5
LOG_QUEUE_LINES = 10000


class JobAborted(HeterPSError, RuntimeError):
    """The launch across hosts ended (or could not start); the message says why and where."""


@dataclass(frozen=True)
class HostsJob:
    endpoint: str  # the coordinator's host:port
    host: str  # this host's address
    coordinator: str  # server 0's host, where the coordinator runs
    digest: str  # of the plan and its placement (every host must have the same)
    members: Mapping[str, bool]  # every host that runs a process of the plan -> whether it runs CPU trainers
    restarts: int = 0  # --restarts N: a failure then waits for the coordinator's word (restart or end)
    # HETERPS_CONNECT_RETRIES: starts of the job again after Paddle's connect-timeout abort (tools/paddle_aborts.py)
    connect_retries: int = 0

    @property
    def may_start_again(self) -> bool:
        """Whether a failure can end in a new round rather than the launch's end: a host that failed then waits
        for the coordinator's word (closing its connection would count it as lost)."""
        return self.restarts > 0 or self.connect_retries > 0

    @property
    def is_coordinator(self) -> bool:
        return self.host == self.coordinator

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"members": dict(self.members)})

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> HostsJob | None:
        text = (os.environ if env is None else env).get(JOB_ENV)
        return None if not text else HostsJob(**json.loads(text))


def host_timeout() -> float:
    return float(cast(float, settings.get("HETERPS_HOST_TIMEOUT")))


def startup_timeout() -> float:
    return float(cast(float, settings.get("HETERPS_STARTUP_TIMEOUT")))


class _Peer:
    """One member's connection, as the coordinator holds it."""

    def __init__(self, host: str, wfile: Any):
        self.host = host
        self.wfile = wfile
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


@dataclass(frozen=True)
class RoundRequest:
    """What the coordinator asks of re-planning (tools/launch.py: ``next_round``) for the job's next round."""

    lost: frozenset[str]  # every host the job has lost and not got back
    lost_before: frozenset[str]  # those when the round that ends was planned (the plan changes only if they differ)
    published: Mapping[str, Any]  # the plan record trainer 0 published this round (fleet/plan_agreement.py), or {}
    plan_now: Mapping[str, Any] | None  # the plan this round runs, as its file holds it (None: the first round's)
    number: int  # the next round's


@dataclass(frozen=True)
class NextRound:
    """A restart's plan (tools/launch.py: ``next_round`` makes it): what every host runs next."""

    plan: Mapping[str, Any]  # the plan, as its file holds it
    job: HostsJob  # the coordinator's host's part of it (members, digest)
    report: Mapping[str, Any]  # for restarts.json: the old and new plans, how the new one was chosen
    better: bool = True  # whether the new plan beats the old one (planning/replan.py: better); a move needs it


class Coordinator:
    """The launch's coordinator (module doc).  ``say`` prints a line on this host's console.

    With ``restarts`` > 0, a failure or a lost host does not end the job: after ``SETTLE_S`` (a host's death
    fails its peers' processes within seconds), the hosts still there are told to stop and start again
    (``restart``), with the plan ``next_round(lost hosts, the job's planning inputs)`` makes for them, and the
    coordinator waits for them to join the new round.  Every restart is written to ``restarts_path``."""

    def __init__(
        self,
        job: HostsJob,
        say: Callable[[str], None],
        restarts: int = 0,
        next_round: Callable[[RoundRequest], NextRound] | None = None,
        restarts_path: str | None = None,
        checkpoint_dir: str | None = None,
    ):
        self.job = job
        self.say = say
        self.restarts_left = restarts
        # Paddle's connect-timeout abort (tools/paddle_aborts.py) starts the job again on the same hosts, without
        # using up --restarts; retry_settling: the failure being settled began with one.
        self.retries_left = job.connect_retries
        self.retry_settling = False
        self.next_round = next_round
        self.restarts_path = restarts_path
        self.checkpoint_dir = checkpoint_dir
        self.round = 0
        self.round_plan: Mapping[str, Any] | None = None  # this round's plan (None: the first round's, from files)
        self.lost: frozenset[str] = frozenset()
        self.round_lost: frozenset[str] = frozenset()  # the hosts lost when this round was planned
        # Lost hosts that came back (module doc): host -> the newest complete checkpoint's passes when it did; the
        # job moves at the first checkpoint after that.
        self.back: dict[str, int] = {}
        self.trouble: list[str] = []
        self.settle_at: float | None = None
        self.history: list[dict[str, Any]] = []
        self.store = BoardStore()
        self.launch_id = uuid.uuid4().hex[:16]
        self.peers: dict[str, _Peer] = {}
        # Hosts of the file that run nothing of this round's plan but stay (--restarts): a restart's plan may use them.
        self.spares: dict[str, _Peer] = {}
        self.done: set[str] = set()
        self.started = False
        self.ended = False
        self.aborted: str | None = None
        self.lock = threading.Lock()
        self.startup_deadline = time.monotonic() + startup_timeout()
        self.host_timeout = host_timeout()
        self.server: socketserver.ThreadingTCPServer | None = None
        self._stop = threading.Event()

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
            if self.aborted and not self.started:
                deadline = max(deadline, min(self.startup_deadline, now + late_joiners_s))
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
                answer = {"round": self.round, "plan": self.round_plan, "lost": sorted(self.lost)}
            wfile.write(json.dumps(answer).encode() + b"\n")
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

    def _spare(self, host: str, peer: _Peer, rfile: Any) -> None:
        """A host that runs nothing of this round's plan: told of a restart (whose plan may use it) and of the end."""
        with self.lock:
            if self.aborted:
                peer.send({"op": "abort", "reason": self.aborted})
                return
            if self.ended:
                peer.send({"op": "end"})
                return
            self.spares[host] = peer
            peer.send({"op": "standby", "round": self.round})
            if host in self.lost:
                self._host_back(host)
        try:
            for _ in iter(rfile.readline, b""):
                peer.last_seen = time.monotonic()
        except OSError:
            pass
        with self.lock:
            peer.gone = True
            if self.spares.get(host) is peer:
                # gone while standing by (not told to go: that unregisters it first): a later round must not wait for it
                del self.spares[host]
                self.back.pop(host, None)
                if not self.ended and not self.aborted:
                    self.lost = self.lost | {host}
                    self.say(f"heterps launch: host {host}, standing by, went away: counted as lost")

    def _tell_spares(self, message: Mapping[str, Any]) -> None:
        """With the lock held."""
        for peer in self.spares.values():
            peer.send(message)
            peer.gone = True
        self.spares = {}

    def _member(self, first: Mapping[str, Any], rfile: Any, wfile: Any) -> None:
        host = str(first.get("host"))
        peer = _Peer(host, wfile)
        peer_round = self.round
        if first.get("spare"):
            self._spare(host, peer, rfile)
            return
        with self.lock:
            if host not in self.job.members:
                listed = ", ".join(self.job.members)
                peer.send({"op": "abort", "reason": f"{host} runs nothing of this launch's plan (its hosts: {listed})"})
                return
            if host in self.peers and not self.peers[host].gone:
                peer.send(
                    {"op": "abort", "reason": f"host {host} joined twice: a second heterps launch with --host {host}"}
                )
                return
            if self.started or self.aborted:
                peer.send({"op": "abort", "reason": self.aborted or f"host {host} joined a launch that had started"})
                peer.gone = True
                self.peers.setdefault(host, peer)
                return
            self.peers[host] = peer
            if first.get("digest") != self.job.digest:
                self._abort(
                    f"host {host} was given another plan or hosts file than {self.job.coordinator} (plan and placement "
                    f"digest {first.get('digest')} there, {self.job.digest} here): give every host the same files"
                )
            elif set(self.job.members) <= {h for h, p in self.peers.items() if not p.gone}:
                self.started = True
                self.say(
                    f"heterps launch: every host joined ({', '.join(self.job.members)}; plan and placement digest "
                    f"{self.job.digest}); the job starts"
                )
                for each in self.peers.values():
                    each.send({"op": "start", "launch_id": self.launch_id})
        try:
            for raw in iter(rfile.readline, b""):
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                peer.last_seen = time.monotonic()
                op = message.get("op")
                with self.lock:
                    if peer_round != self.round:
                        break  # a host of an earlier round: it starts again, or was dropped
                    if op == "failed":
                        self._trouble_or_abort(
                            f"host {host}: {message.get('reason')}", retryable=bool(message.get("retryable"))
                        )
                    elif op == "done":
                        self.done.add(host)
                        trainer_hosts = {h for h, trains in self.job.members.items() if trains}
                        if not self.ended and not self.aborted and trainer_hosts <= self.done:
                            self.ended = True
                            for each in self.peers.values():
                                each.send({"op": "end"})
                            self._tell_spares({"op": "end"})
        except OSError:
            pass
        with self.lock:
            peer.gone = True
            if peer_round == self.round and not self.ended and not self.aborted:
                self._trouble_or_abort(
                    f"host {host}'s heterps launch went away (its connection to the coordinator closed: the process "
                    "was killed, or the machine or its network is gone)"
                )

    def _trouble_or_abort(self, reason: str, retryable: bool = False) -> None:
        """With the lock held: a failure ends the launch, or, once the launch had started, starts the settling that
        ends in a new round: a restart (with restarts left), or a retry when the first failure is Paddle's
        connect-timeout abort (``retryable``) and retries are left.  What fails while a failure settles is
        counted with it (a process's end fails its peers within seconds)."""
        if self.aborted or self.ended:
            return
        if not self.started or self.next_round is None:
            self._abort(reason)
            return
        if self.settle_at is None:
            self.retry_settling = retryable and self.retries_left > 0
            if self.restarts_left <= 0 and not self.retry_settling:
                self._abort(reason)
                return
            self.settle_at = time.monotonic() + SETTLE_S
            left = (
                f"{self.retries_left} retry(-ies) of this abort left, HETERPS_CONNECT_RETRIES"
                if self.retry_settling
                else f"{self.restarts_left} restart(s) left"
            )
            self.say(f"heterps launch: {reason}; the job will start again ({left})")
        self.trouble.append(reason)

    def _host_back(self, host: str) -> None:
        """With the lock held: a lost host stands by again (module doc)."""
        self.lost = self.lost - {host}
        if self.checkpoint_dir is None:
            self.say(
                f"heterps launch: host {host} is back and stands by; without --checkpoint-dir the job stays on its "
                "plan (a restart's plan may use it)"
            )
            return
        self.back[host] = newest_checkpoint(self.checkpoint_dir)
        self.say(
            f"heterps launch: host {host} is back and stands by; at the next checkpoint the job moves to a plan with "
            "it, if that plan is better"
        )

    def _restart(self) -> None:
        """With the lock held: the settled failure's restart (class doc)."""
        now = time.monotonic()
        lost_now = {h for h, p in self.peers.items() if p.gone or now - p.last_seen > self.host_timeout}
        lost_now |= {h for h in self.job.members if h not in self.peers}
        reason = "; ".join(self.trouble)
        if self.job.coordinator in lost_now:
            self._abort(f"{reason} (the coordinator's own host cannot be replaced: the job ends)")
            return
        # A retry keeps the job's hosts: a host lost as well makes it a restart (or, with none left, the end).
        retry = self.retry_settling and not lost_now
        if not retry and self.restarts_left <= 0:
            self._abort(f"{reason}; and lost host(s) {', '.join(sorted(lost_now))}: no restarts left (--restarts)")
            return
        lost = self.lost | frozenset(lost_now)
        for host in lost_now:
            self.back.pop(host, None)
        try:
            nxt = self._plan_round(lost)
        except HeterPSError as exc:
            self._abort(f"{reason}; the job cannot go on with what is left: {exc}")
            return
        except Exception as exc:  # a bug in re-planning must still end the job, loudly, on every host
            self._abort(f"{reason}; re-planning failed ({type(exc).__name__}: {exc})")
            return
        if retry:
            self.retries_left -= 1
            used = 1 + sum(1 for event in self.history if event["kind"] == "retry")
            title = f"retry {used} after Paddle's connect-timeout abort ({self.retries_left} left; round {{round}})"
            self._next_round(nxt, lost, [], reason, "retry", title)
            return
        self.restarts_left -= 1
        used = 1 + sum(1 for event in self.history if event["kind"] == "restart")
        title = f"restart {used} ({self.restarts_left} left; round {{round}})"
        self._next_round(nxt, lost, sorted(lost_now), reason, "restart", title)

    def _move(self) -> None:
        """With the lock held: a checkpoint after a host came back; the job moves to a plan with it if better."""
        hosts = ", ".join(sorted(self.back))
        self.back = {}
        try:
            nxt = self._plan_round(self.lost)
        except Exception as exc:  # the job runs on as it was: its plan still works
            self.say(
                f"heterps launch: no plan with host(s) {hosts} back ({type(exc).__name__}: {exc}); the job goes on"
            )
            return
        if not nxt.better:
            self.say(
                f"heterps launch: with host(s) {hosts} back the plan would be {nxt.report.get('new_summary', '?')}, no "
                "better than the one running: the job goes on with it (the host(s) stand by)"
            )
            return
        reason = f"host(s) {hosts} back"
        self._next_round(nxt, self.lost, [], reason, "move", "moving to another plan (round {round})")

    def _plan_round(self, lost: frozenset[str]) -> NextRound:
        assert self.next_round is not None
        published = self.store.answer({"op": "get", "key": "plan"}).get("value") or {}
        return self.next_round(RoundRequest(lost, self.round_lost, published, self.round_plan, self.round + 1))

    def _next_round(
        self, nxt: NextRound, lost: frozenset[str], lost_now: list[str], reason: str, kind: str, title: str
    ) -> None:
        """With the lock held: every host told to stop and start again with ``nxt``'s plan (a restart or a move)."""
        self.round += 1
        self.lost = self.round_lost = lost
        event = {
            "round": self.round,
            "kind": kind,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "why": reason,
            "lost": lost_now,
            "lost_so_far": sorted(lost),
            # the newest complete checkpoint as the round is decided: the next round resumes from it (unless a save
            # that was finishing as the hosts stopped overtakes it; each host's console says which it took)
            **checkpoint_report(self.checkpoint_dir),
            **dict(nxt.report),
        }
        self.history.append(event)
        if self.restarts_path is not None:
            write_atomic(self.restarts_path, json.dumps({"restarts": self.history}, indent=2) + "\n")
        what = f"lost {', '.join(lost_now)}" if lost_now else reason
        self.say(f"heterps launch: {title.format(round=self.round)}: {what}; {nxt.report.get('summary', '')}")
        message = {"op": "restart", "round": self.round, "plan": dict(nxt.plan), "lost": sorted(lost), "why": reason}
        for peer in self.peers.values():
            peer.send(message)
            peer.gone = True  # its connection ends with this round
        self._tell_spares(message)
        self.job = nxt.job
        self.round_plan = dict(nxt.plan)
        self.peers = {}
        self.done = set()
        self.started = False
        self.trouble = []
        self.settle_at = None
        self.retry_settling = False
        self.launch_id = uuid.uuid4().hex[:16]
        self.store = BoardStore()
        self.startup_deadline = time.monotonic() + startup_timeout()

    def _abort(self, reason: str) -> None:
        """With the lock held: the first reason ends the launch on every host."""
        if self.aborted or self.ended:
            return
        self.aborted = reason
        for peer in self.peers.values():
            peer.send({"op": "abort", "reason": reason})
        self._tell_spares({"op": "abort", "reason": reason})

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            now = time.monotonic()
            with self.lock:
                if self.aborted or self.ended:
                    continue
                if self.settle_at is not None:
                    if now >= self.settle_at:
                        self._restart()
                    continue
                if not self.started and now > self.startup_deadline:
                    missing = [h for h in self.job.members if h not in self.peers or self.peers[h].gone]
                    self._abort(
                        f"host{'s' * (len(missing) != 1)} {', '.join(missing)} never joined the launch within "
                        f"{startup_timeout():.0f} s (HETERPS_STARTUP_TIMEOUT): start `heterps launch --hosts ...` "
                        "there too, with the same files"
                    )
                    continue
                if self.started and self.back and self.checkpoint_dir is not None:
                    if newest_checkpoint(self.checkpoint_dir) > max(self.back.values()):
                        self._move()
                        continue
                if self.started:
                    for peer in list(self.peers.values()):
                        if not peer.gone and now - peer.last_seen > self.host_timeout:
                            self._trouble_or_abort(
                                f"host {peer.host} stopped answering ({self.host_timeout:.0f} s without a word; "
                                "HETERPS_HOST_TIMEOUT)"
                            )
                            break
                for peer in self.peers.values():
                    peer.send({"op": "beat"})


def newest_checkpoint(root: str | None) -> int:
    """The passes of the newest complete checkpoint the launch wrote under ``root`` (0: none).  Complete: its
    directory has its final name only once its manifest is written (runtime/launch_checkpoints.py)."""
    from heterps_paddle.runtime.checkpoint_choice import listed  # no Paddle at import (that module's doc)

    return next((passes for passes, _ in listed(root)), 0) if root else 0


def checkpoint_report(root: str | None) -> dict[str, Any]:
    """For restarts.json: the checkpoint a new round resumes from, and the training since it (redone)."""
    from heterps_paddle.runtime.checkpoint_choice import choose

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


def ask_round(endpoint: str, deadline: float) -> dict[str, Any]:
    """The job's round as its coordinator says (a host's launch started again asks before it joins)."""
    with connect_until(endpoint, deadline) as conn:
        conn.settimeout(max(5.0, deadline - time.monotonic()))
        conn.sendall(json.dumps({"op": "round"}).encode() + b"\n")
        raw = conn.makefile("rb").readline()
    if not raw:
        raise OSError(f"the coordinator at {endpoint} closed the connection without an answer")
    return dict(json.loads(raw))


def connect_until(endpoint: str, deadline: float) -> socket.socket:
    """A TCP connection to ``endpoint``, retried every JOIN_RETRY_S until ``deadline`` (then the last OSError)."""
    host, port = endpoint.rsplit(":", 1)
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=5.0)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(JOIN_RETRY_S)


class Member:
    """A host's side of the launch, in the process that runs Paddle's launcher (tools/launch.py: _child)."""

    def __init__(self, job: HostsJob):
        self.job = job
        self.conn: socket.socket | None = None
        self.lock = threading.Lock()
        self.ended = threading.Event()
        self.aborted = threading.Event()
        self.abort_reason = ""
        self.launch_id = ""
        self.restart: dict[str, Any] | None = None  # the coordinator's restart message, when the job starts again
        self._closed = threading.Event()

    def join(self) -> str:
        """Join and wait until every host has: the launch's id.  JobAborted when the launch cannot start."""
        timeout = startup_timeout()
        # The coordinator gives up at its own deadline and says why; this one only covers a coordinator that never
        # came up.
        deadline = time.monotonic() + timeout + 10.0
        self.conn = self._connect(deadline)
        self._send({"op": "join", "host": self.job.host, "digest": self.job.digest})
        reader = self.conn.makefile("rb")
        self.conn.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            while True:
                raw = reader.readline()
                if not raw:
                    raise JobAborted(f"the launch's coordinator on {self.job.coordinator} closed the connection")
                message = json.loads(raw)
                if message.get("op") == "abort":
                    raise JobAborted(str(message.get("reason")))
                if message.get("op") == "start":
                    self.launch_id = str(message["launch_id"])
                    break
        except TimeoutError:
            raise JobAborted(
                f"the launch did not start within {timeout:.0f} s (HETERPS_STARTUP_TIMEOUT): not every host joined"
            ) from None
        self.conn.settimeout(host_timeout())
        threading.Thread(target=self._read, args=(reader,), name="heterps-member-read", daemon=True).start()
        threading.Thread(target=self._beat, name="heterps-member-beat", daemon=True).start()
        return self.launch_id

    def _connect(self, deadline: float) -> socket.socket:
        """A connection to the coordinator, retried until ``deadline`` (it may not be up yet)."""
        try:
            return connect_until(self.job.endpoint, deadline)
        except OSError as exc:
            raise JobAborted(
                f"the launch's coordinator at {self.job.endpoint} (host {self.job.coordinator}) did not come up within "
                f"{startup_timeout():.0f} s (HETERPS_STARTUP_TIMEOUT; last error: {exc}): start `heterps launch "
                f"--hosts ...` on {self.job.coordinator} too"
            ) from None

    def standby(self) -> dict[str, Any]:
        """A spare host (it runs nothing of this round's plan, and the launch may restart): wait for the
        coordinator's word, a restart (whose plan may use this host), the end or the failure, and return it."""
        self.conn = self._connect(time.monotonic() + startup_timeout() + 10.0)
        self._send({"op": "join", "host": self.job.host, "digest": self.job.digest, "spare": True})
        self.conn.settimeout(None)
        threading.Thread(target=self._beat, name="heterps-member-beat", daemon=True).start()
        reader = self.conn.makefile("rb")
        try:
            for raw in iter(reader.readline, b""):
                message = json.loads(raw)
                if message.get("op") in ("restart", "end", "abort"):
                    return dict(message)
        except (OSError, ValueError):
            pass
        finally:
            self.close()
        return {"op": "abort", "reason": f"lost the launch's coordinator on host {self.job.coordinator}"}

    def _send(self, message: Mapping[str, Any]) -> None:
        with self.lock:
            if self.conn is None or self._closed.is_set():
                return
            try:
                self.conn.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                pass  # the reader sees the connection go

    def _read(self, reader: Any) -> None:
        try:
            for raw in iter(reader.readline, b""):
                message = json.loads(raw)
                op = message.get("op")
                if op == "abort":
                    self._abort(str(message.get("reason")))
                elif op == "end":
                    self.ended.set()
                elif op == "restart":
                    self.restart = message
                    self._abort(f"the job starts again (restart {message.get('round')}): {message.get('why')}")
                    return
        except TimeoutError:
            self._abort(
                f"the launch's coordinator on {self.job.coordinator} stopped answering ({host_timeout():.0f} s; "
                "HETERPS_HOST_TIMEOUT)"
            )
            return
        except (OSError, ValueError):
            pass
        if not self.ended.is_set() and not self._closed.is_set():
            self._abort(
                f"lost the launch's coordinator on host {self.job.coordinator} (its heterps launch went away, or the "
                "machine or its network is gone)"
            )

    def _abort(self, reason: str) -> None:
        if not self.aborted.is_set():
            self.abort_reason = reason
            self.aborted.set()

    def _beat(self) -> None:
        while not self._closed.wait(BEAT_S):
            self._send({"op": "beat"})

    def report_failure(self, reason: str, retryable: bool = False) -> None:
        """``retryable``: the failure is Paddle's connect-timeout abort (tools/paddle_aborts.py)."""
        self._send({"op": "failed", "reason": reason, "retryable": retryable})

    def report_done(self) -> None:
        self._send({"op": "done"})

    def settled(self) -> bool:
        return self.ended.is_set() or self.aborted.is_set()

    def close(self) -> None:
        self._closed.set()
        with self.lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                except OSError:
                    pass


class LogForwarder:
    """A host's console lines, also sent to the coordinator's host (best effort: a line that cannot be sent is
    still on this host's console and in its logs)."""

    def __init__(self, job: HostsJob):
        self.job = job
        self.lines: queue.Queue[str | None] = queue.Queue(LOG_QUEUE_LINES)
        self.thread = threading.Thread(target=self._run, name="heterps-log-forward", daemon=True)
        self.thread.start()

    def send(self, line: str) -> None:
        try:
            self.lines.put_nowait(line)
        except queue.Full:
            pass

    def close(self, wait_s: float = 5.0) -> None:
        try:
            self.lines.put_nowait(None)
        except queue.Full:
            pass
        self.thread.join(timeout=wait_s)

    def _run(self) -> None:
        try:
            conn = connect_until(self.job.endpoint, time.monotonic() + startup_timeout() + 10.0)
        except OSError:
            return
        with conn:
            try:
                conn.sendall(json.dumps({"op": "log", "host": self.job.host}).encode() + b"\n")
                while True:
                    line = self.lines.get()
                    if line is None:
                        return
                    conn.sendall(line.rstrip("\n").encode() + b"\n")
            except OSError:
                return
