"""The coordinator of a launch across hosts: the shell that carries out the job's state machine (launch/machine.py).

It runs inside ``heterps launch`` on server 0's host, on the hosts file's ``control_port``, in three parts:

- the control server (launch/control_server.py): admission, the proof of the job's key, bounded reading, the
  console lines other hosts stream to it;
- the board (launch/board.py): the records the job's processes share, and who may write what;
- this module, the machine's shell: it turns what a proven peer asks and says, a closed connection, a silent host,
  the newest checkpoint and the clock into the machine's events, and carries out the machine's actions: messages to
  the peers and lines on the console (launch/render.py), records in the event log (launch/event_log.py),
  re-planning (launch/rounds.py) and ``restarts.json``.

It keeps no state of the job beside the machine's: which hosts joined, stand by, started, were lost is the
machine's; this module only knows each host's connection.  One lock orders it all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, BinaryIO, Callable, Mapping, Sequence

from heterps_paddle import control
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import write_atomic
from heterps_paddle.launch import machine as m
from heterps_paddle.launch import render
from heterps_paddle.launch.board import Board
from heterps_paddle.launch.control_server import ControlServer, Peer, Role, printable
from heterps_paddle.launch.event_log import EventLog, JobLog, proposal_record
from heterps_paddle.launch.job import HostsJob, JobAborted, RoundPlan, RoundRequest, host_timeout, startup_timeout
from heterps_paddle.launch.leave import MAX_GRACE_S
from heterps_paddle.launch.measuring import Measuring, idle_units
from heterps_paddle.launch.session import stop_session
from heterps_paddle.launch.shell import drive
from heterps_paddle.planning.hosts import joined_spec
from heterps_paddle.rendezvous import MEASURED_PREFIX
from heterps_paddle.runtime.checkpoint_choice import ask_checkpoint, captured, choose, listed

ON_SCALE_TIMEOUT_S = 120.0  # the --on-scale command's, at most
SETTLE_S = 5.0  # after a failure, what else is lost: a host's death fails its peers' processes within seconds
WATCH_S = 1.0


def advise_only(adapt: m.Adapt) -> m.Adapt:
    return replace(adapt, mode="advise") if adapt.mode == "on" else adapt


def first_round(job: HostsJob) -> m.Round:
    return m.Round(0, dict(job.members), job.coordinator, job.digest)


class Coordinator:
    """The launch's coordinator (module doc).  ``say`` prints a line on this host's console; ``next_round`` plans a
    new round (launch/rounds.py; without it any failure ends the launch); every change of round is written to
    ``restarts_path``; ``log``: the event log the job's records go to."""

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
        log: EventLog | None = None,
        adapt: m.Adapt = m.Adapt(),
        propose: Callable[[RoundRequest, Sequence[Mapping[str, Any]], str], m.Proposal | None] | None = None,
        on_scale: str | None = None,
    ):
        self.job = job  # this host's part of the running round (the control port, the plan's writer)
        self.say = say
        self.next_round = next_round
        self.restarts_path = restarts_path
        self.checkpoint_dir = checkpoint_dir
        # the job's records: numbered, kept, streamed to every host (each writes them into its own log)
        self.records = None if log is None else JobLog(log, uuid.uuid4().hex[:16])
        if self.records is not None:
            self.records.send = self._stream
        rules = m.Rules(
            restarts=restarts,
            connect_retries=job.connect_retries,
            settle_s=settle_s,
            startup_s=startup_timeout(),
            can_replan=next_round is not None,
            checkpoints=checkpoint_dir is not None,
            file_hosts=frozenset(job.file_hosts),
            files_digest=job.digest,
            # without checkpoints a move cannot resume: the job only says what it would do (said at launch)
            adapt=m.Adapt() if propose is None else adapt if checkpoint_dir is not None else advise_only(adapt),
        )
        self.propose = propose
        self.on_scale = on_scale
        self.said_no_inputs = False
        self.reconsidering: threading.Thread | None = None  # the reconsideration planning now, if any
        self.measured_logged: set[tuple[int, str]] = set()  # (round, board key) of the measured records written
        self.machine = m.first_job(rules, first_round(job), time.monotonic())
        self.planned: RoundPlan | None = None  # the plan a NextRound action starts
        self.launch_id = uuid.uuid4().hex[:16]
        self.board = Board(job.plan_writer, self.launch_id, job.trainers)
        # each host's connection: the round's members, the spares (who they are is the machine's)
        self.members: dict[str, Peer] = {}
        self.spares: dict[str, Peer] = {}
        self.lock = threading.Lock()
        self.host_timeout = host_timeout()
        self.server = ControlServer(job.endpoint, key, self.handle, lambda text: self.say(text))
        self.measuring = Measuring(self.records, lambda text: self.say(text))
        self._stop = threading.Event()

    # ---- serving

    def start(self) -> Coordinator:
        try:
            self.server.start()
        except OSError as exc:
            raise JobAborted(
                f"cannot serve the launch's coordinator on {self.job.endpoint} ({exc}): is another launch of this "
                "hosts file running, or is control_port taken on this host?"
            ) from None
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
            if self.machine.state is m.JobState.ABORTED and not self.machine.seen.started:
                deadline = max(deadline, min(self.machine.seen.startup_deadline, now + late_joiners_s))
        while time.monotonic() < deadline:
            with self.lock:
                told = self.machine.seen.started or all(h in self.members for h in self.machine.round.members)
                if told and all(peer.gone for peer in self.members.values()):
                    break
            time.sleep(0.1)
        self._stop.set()
        self.server.close()

    @property
    def ended(self) -> bool:
        return self.machine.state is m.JobState.ENDED

    @property
    def aborted(self) -> str | None:
        return self.machine.reason if self.machine.state is m.JobState.ABORTED else None

    # ---- requests (the control server's proven connections)

    def handle(self, first: Mapping[str, Any], conn: socket.socket, rfile: BinaryIO, wfile: Any) -> None:
        """A proven peer's first request."""
        op = first.get("op")
        if op == "round":
            with self.lock:
                job = self.machine
                answer = {
                    "round": job.round.number,
                    "plan": job.round.plan,
                    "lost": sorted(job.lost),
                    "joined": [{"address": h, **spec} for h, spec in job.extra.items()],
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
                self._spare(
                    Peer(host, Role.SPARE, conn, rfile, wfile), str(first["digest"]), joining, first.get("records")
                )
            else:
                self._member(Peer(host, Role.MEMBER, conn, rfile, wfile), str(first["digest"]), first.get("records"))
        elif op == "leave":
            host, grace = first.get("host"), first.get("grace_s")
            if not isinstance(host, str) or isinstance(grace, bool) or not isinstance(grace, (int, float)):
                raise control.Unproven("a leave without a host, or without a grace time in seconds")
            if not 0 <= grace <= MAX_GRACE_S:  # NaN and infinities too
                raise control.Unproven(f"a leave's grace time must be 0..{MAX_GRACE_S:.0f} s")
            with self.lock:
                event = m.LeaveAsked(host, float(grace), self._newest_captured())
                self._feed(event, Peer(host, Role.REQUEST, conn, rfile, wfile))
        else:
            with self.lock:
                board = self.board
            control.send(wfile, board.answer(first))

    def _unknown_type(self, joining: Mapping[str, Any]) -> str | None:
        """Why a joining machine's type cannot be planned on (None: it can): not a type of the cluster the job's
        plan was made on (its published planning inputs), when the job published them."""
        with self.lock:
            types = self.board.cluster_types()
        if types and joining["type"] not in types:
            return f"type {printable(str(joining['type']))!r} is not a resource type of the job's cluster ({', '.join(types)})"
        return None

    def _spare(self, peer: Peer, digest: str, joining: Mapping[str, Any] | None = None, seen: Any = None) -> None:
        """A host that runs nothing of this round's plan: told of a new round (whose plan may use it) and of the
        end.  ``joining``: a machine from outside the hosts file, as it said what it is."""
        with self.lock:
            self._catch_up(peer, seen)
            self._feed(m.SpareJoined(peer.host, digest, newest_checkpoint(self.checkpoint_dir), joining), peer)
        if peer.gone:
            return  # refused, or told the job's end
        try:
            while peer.read() is not None:  # beats
                pass
        except (OSError, control.Unproven):
            pass
        with self.lock:
            peer.gone = True
            if self.spares.get(peer.host) is peer:  # not told to go (that lets it go first)
                del self.spares[peer.host]
                self._feed(m.SpareGone(peer.host))

    def _member(self, peer: Peer, digest: str, seen: Any = None) -> None:
        with self.lock:
            peer.round = self.machine.round.number
            self._catch_up(peer, seen)
            self._feed(m.Joined(peer.host, digest), peer)
        if peer.gone:
            return  # refused
        why = ""
        try:
            while True:
                message = peer.read()
                if message is None:
                    break
                event = _member_event(peer.host, peer.round, message)
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
            self._feed(m.HostGone(peer.host, peer.round, printable(why)))

    # ---- the machine

    def _feed(self, event: m.Event, peer: Peer | None = None) -> None:
        """With the lock held: ``event`` through the machine, and its actions carried out (``peer``: the connection
        the event came on, for the answers meant for it)."""
        answering: list[Peer | None] = [peer, None]  # whom the step's actions answer; then the one before

        def stepped(job: m.Job, actions: Sequence[m.Action]) -> None:
            self.machine = job  # what _carry_out reads
            came = answering[0]  # the event's connection at the first step; none at the steps that follow
            refused = any(isinstance(action, m.Refuse) for action in actions)
            if came is not None and not refused and came.role is Role.MEMBER and came.host in job.seen.joined:
                self.members[came.host] = came  # it hears what the round's hosts hear from now on
            answering[:] = [None, came]

        def carry_out(action: m.Action, job: m.Job) -> m.Event | None:
            return self._carry_out(action, answering[1])

        self.machine = drive(self.machine, event, time.monotonic, self.records, carry_out, stepped)

    def _carry_out(self, action: m.Action, peer: Peer | None) -> m.Event | None:
        line = render.line(action, self.machine)
        if line is not None:
            self.say(line)
        if isinstance(action, (m.Refuse, m.StandBy, m.LeaveAnswer)):
            assert peer is not None
            peer.send(render.message(action))
            if isinstance(action, m.StandBy):
                self.spares[peer.host] = peer
            else:
                peer.gone = True
                if isinstance(action, m.Refuse) and action.host in self.job.members:
                    self.members.setdefault(action.host, peer)  # it heard why: close() need not wait for it
        elif isinstance(action, m.Dismiss):
            told = peer if peer is not None and peer.host == action.host else None
            told = told or self.spares.pop(action.host, None) or self.members.get(action.host)
            if told is not None:
                told.send(render.message(action))
                told.gone = True
        elif isinstance(action, m.Start):
            for each in self.members.values():
                each.send({"op": "start", "launch_id": self.launch_id})
        elif isinstance(action, m.Beat):
            for each in self.members.values():
                each.send({"op": "beat"})
        elif isinstance(action, (m.EndAll, m.AbortAll)):
            if isinstance(action, m.EndAll):  # the job's last figures, with the trainers' last records
                self.measuring.tick(self.machine.round.number, self.board, self.job.devices, force=True)
            self._tell_all(render.message(action))
        elif isinstance(action, m.AskCheckpoint):
            if self.checkpoint_dir is not None:
                path = ask_checkpoint(self.checkpoint_dir, self.launch_id, action.reason, action.hold_s)
                self.say(
                    f"heterps launch: asked the trainers for a checkpoint once they have trained the shards in hand ({path})"
                )
        elif isinstance(action, m.Replan):
            return self._replan(action)
        elif isinstance(action, m.Reconsider):
            self._reconsider(action)
        elif isinstance(action, m.OnScale):
            self._on_scale(action)
        elif isinstance(action, m.NextRound):
            self._next_round(action)
        return None

    def _catch_up(self, peer: Peer, seen: Any) -> None:
        """A joining host's log gets the job's records it lacks (``seen``: the job and number of its newest), first:
        what the join itself leads to streams after them."""
        if self.records is None:
            return
        job, seq = (seen.get("job"), seen.get("seq")) if isinstance(seen, Mapping) else (None, 0)
        for record in self.records.since(job if isinstance(job, str) else None, seq if isinstance(seq, int) else 0):
            peer.send({"op": "record", "record": record})

    def _stream(self, record: Mapping[str, Any]) -> None:
        """A job record to every host that hears the job (with the lock held: it comes from the machine's step)."""
        for each in (*self.members.values(), *self.spares.values()):
            each.send({"op": "record", "record": record})

    def _tell_all(self, message: Mapping[str, Any]) -> None:
        """``message`` to every host of the round and every spare; the spares are let go."""
        for each in self.members.values():
            each.send(message)
        for each in self.spares.values():
            each.send(message)
            each.gone = True
        self.spares = {}

    def _request(
        self,
        lost: frozenset[str],
        joined: Mapping[str, Mapping[str, Any]],
        refit: Any,
        adapt: bool = False,
        decided: m.Proposal | None = None,
    ) -> RoundRequest:
        job = self.machine
        return RoundRequest(
            lost,
            job.round.lost,
            self.board.published() or {},
            job.round.plan,
            job.round.number + 1,
            joined={h: dict(spec) for h, spec in joined.items() if h not in lost},
            joined_before=job.round.joined,
            refit=refit,
            adapt=adapt,
            decided=decided,
        )

    def _not_planned(self, why: str) -> None:
        """A reconsideration answered without a plan: its ``proposed`` record says why (every one has its answer)."""
        if self.records is not None:
            self.records.write("proposed", proposal=None, detail=f"not planned: {why}")

    def _reconsider(self, action: m.Reconsider) -> None:
        """Plan again on the measured rates, in a thread of its own (planning takes a while; the machine goes on),
        and feed the machine its proposal."""
        assert self.propose is not None
        if self.reconsidering is not None and self.reconsidering.is_alive():
            # one at a time, beside the job's training (one a reconsideration piled up under a budget, each minutes)
            return self._not_planned("the reconsideration asked for before is still planning")
        request, number = self._request(self.machine.lost, self.machine.extra, action.refit), self.machine.round.number
        windows = [rates.to_record() for rates in action.windows]
        if not request.published.get("plan"):  # it may wait for a host's type to be timed
            return self._not_planned("trainer 0 has not published its plan yet")
        if not request.published.get("inputs"):
            # the job published nothing to plan again with (a saved plan): it runs its plan as it is; said once
            if not self.said_no_inputs:
                self.said_no_inputs = True
                self.say(
                    "heterps launch: adapt: the job published no planning inputs (a saved plan as "
                    "heterps_configs['plan'], or no heterps_configs['cluster']): it cannot plan again and runs its "
                    "plan as it is; plan inside minimize (heterps_configs['cluster']) for the plan to follow the job"
                )
            return

        def work() -> None:
            try:
                proposal = self.propose(request, windows, action.why) if self.propose else None
                event = m.Proposed(proposal, "" if proposal is not None else "no window to correct the model by")
            except Exception as exc:  # re-planning failed: said, and the job goes on with its plan
                event = m.Proposed(None, printable(f"{type(exc).__name__}: {exc}"))
            with self.lock:
                if self.machine.round.number != number:
                    return  # a new round started meanwhile: its own rates decide
                if event.proposal is None:
                    self.say(f"heterps launch: adapt: no proposal ({event.detail})")
                if self.records is not None:  # what was proposed, decided on or not (an adapt record says so)
                    found = None if event.proposal is None else proposal_record(event.proposal)
                    self.records.write("proposed", proposal=found, detail=event.detail)
                self._feed(event)

        self.reconsidering = threading.Thread(target=work, name="heterps-reconsider", daemon=True)
        self.reconsidering.start()

    def _on_scale(self, action: m.OnScale) -> None:
        """The user's --on-scale command, with what is wanted and what was let go (JSON on stdin), bounded; its
        failure or hang is logged, never the job's."""
        if self.on_scale is None:
            self.say("heterps launch: adapt: no --on-scale command: the wish is in the event log and heterps status")
            return
        message = {"wanted": dict(action.wanted), "released": dict(action.released), "why": action.why}
        threading.Thread(
            target=run_on_scale, args=(self.on_scale, message, self.records, self.say), daemon=True
        ).start()

    def _replan(self, action: m.Replan) -> m.Event:
        """The next round's plan for the hosts the job has, those of the file and ``action.joined``, less
        ``action.lost`` (launch/rounds.py); an adaptive move's is the plan the machine decided."""
        assert self.next_round is not None
        adapt = action.kind is m.Kind.ADAPT
        request = self._request(action.lost, action.joined, action.refit, adapt, action.decided)
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
            released=dict(planned.released),
        )

    def _next_round(self, action: m.NextRound) -> None:
        """Every host told to stop and start again with the new round's plan (a restart, a retry, a move, a leave)."""
        assert self.planned is not None
        if self.restarts_path is not None:
            history = [change.to_dict() for change in self.machine.history]
            write_atomic(self.restarts_path, json.dumps({"restarts": history}, indent=2) + "\n")
        self._tell_all(render.message(action))
        for each in self.members.values():
            each.gone = True  # its connection ends with this round
        self.job = self.planned.job
        self.planned = None
        self.members = {}
        self.launch_id = uuid.uuid4().hex[:16]
        self.board = Board(self.job.plan_writer, self.launch_id, self.job.trainers)

    def _log_measured(self) -> None:
        """A ``measured`` record of each host type timed for the round's plan (fleet/host_measure.py), once."""
        if self.records is None:
            return
        try:
            found = self.board.entries(MEASURED_PREFIX)
        except Exception:  # a board being replaced: the next tick reads it
            return
        for key, value in sorted(found.items()):
            logged = (self.machine.round.number, key)
            if logged in self.measured_logged or not isinstance(value, Mapping):
                continue
            self.measured_logged.add(logged)
            self.records.write(
                "measured",
                round=self.machine.round.number,
                resource=value.get("type"),
                **{k: value.get(k) for k in ("host", "seconds", "seconds_per_sample", "file_seconds_per_sample")},
                why_not=value.get("why_not") or None,
            )

    def _newest_captured(self) -> float:
        return newest_captured(self.checkpoint_dir, self.launch_id)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            with self.lock:
                if self.machine.state.over:
                    continue
                now = time.monotonic()
                if self.machine.seen.started:
                    for peer in list(self.members.values()):
                        if not peer.gone and now - peer.last_seen > self.host_timeout:
                            self._feed(m.HostSilent(peer.host, peer.round, self.host_timeout))
                waiting = self.machine.back or self.machine.leaving or self.machine.seen.adapting is not None
                if waiting and self.checkpoint_dir is not None:
                    self._feed(m.CheckpointComplete(newest_checkpoint(self.checkpoint_dir)))
                idle = idle_units(
                    self.job.held, self.machine.extra, [*self.members, *self.spares], self.machine.round.members
                )
                self._log_measured()
                rates = self.measuring.tick(self.machine.round.number, self.board, self.job.devices, idle=idle)
                if rates is not None:
                    # whole windows correct the model: a round's first seconds (processes starting, tables
                    # warming) are not what its plan trains
                    self._feed(m.Measured(rates, whole=rates.window_s >= 0.9 * self.measuring.gauge.window_s))
                self._feed(m.Tick())


def _member_event(host: str, number: int, message: Mapping[str, Any]) -> m.Event | None:
    """What a member's line says (None: a beat); Unproven for a line a member does not send."""
    op = message.get("op")
    if op == "beat":
        return None
    if op == "done":
        return m.Done(host, number)
    if op == "failed":
        reason, connect_timeout = message.get("reason"), message.get("connect_timeout", False)
        if not isinstance(reason, str) or not isinstance(connect_timeout, bool):
            raise control.Unproven(
                "a 'failed' line without a reason (text) or with a connect_timeout that is not true/false"
            )
        return m.ProcessFailed(host, number, printable(reason), connect_timeout)
    raise control.Unproven(f"an op a member does not send ({printable(str(op))[:40]!r})")


def newest_captured(root: str | None, launch: str) -> float:
    """The passes done in the newest checkpoint whose state is fixed: complete, or captured by the running launch
    ``launch`` and persisting.  A leave waits for one newer: a checkpoint persisting when the host asked holds
    training from before the notice, and the round without the host would train it again.  (A host back or joining
    waits only for a checkpoint completed after it stands by, the sooner to move: what the trainers trained since
    that checkpoint's capture is redone, as before.)"""
    if root is None:
        return 0.0
    return max(newest_checkpoint(root), max((at.done for at in captured(root, launch)), default=0.0))


def newest_checkpoint(root: str | None) -> float:
    """The passes done in the newest complete checkpoint the launch wrote under ``root`` (a fraction inside a pass;
    0: none).  Complete: its directory has its final name only once its manifest is written
    (runtime/launch_checkpoints.py)."""
    return next((at.done for at, _ in listed(root)), 0.0) if root else 0.0


def checkpoint_report(root: str | None) -> dict[str, Any]:
    """For the event log and restarts.json: the checkpoint a new round resumes from, and the training since it
    (redone)."""
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
        "passes_done": choice.at.done,
        "work_redone": f"the training since that checkpoint ({since:.0f} s; after {choice.at})",
    }


def run_on_scale(command: str, message: Mapping[str, Any], records: Any, say: Callable[[str], None]) -> None:
    """``command`` (a shell command line, the user's) with ``message`` as JSON on stdin, at most
    ON_SCALE_TIMEOUT_S; what it did goes to the event log and the console."""
    try:
        proc = subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # whatever it starts is stopped with it on a hang
        )
    except OSError as exc:
        code, output = None, f"could not be run: {exc}"
    else:
        try:
            output, _ = proc.communicate(json.dumps(message), timeout=ON_SCALE_TIMEOUT_S)
            code, output = proc.returncode, output[-2000:]
        except subprocess.TimeoutExpired:
            stop_session(proc.pid)
            proc.wait()
            code, output = None, f"still running after {ON_SCALE_TIMEOUT_S:.0f} s: stopped"
    if records is not None:
        records.write("on_scale_ran", command=command, code=code, output=output)
    what = "ran" if code == 0 else f"FAILED ({'exit status ' + str(code) if code is not None else output})"
    say(f"heterps launch: adapt: --on-scale {what}; the job goes on")
