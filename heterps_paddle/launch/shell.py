"""The one place a job's state machine (launch/machine.py) is stepped, for one host and many: an event through the
machine, the job's records of what it decided written (launch/event_log.py), each action handed to the shell that
carries it out, and what an action leads to (an answer the shell made, e.g. the plan of the next round) fed back
the same way.  The shells differ only in how they carry actions out: one host's launch (launch/driver.py:
``OneHost``) does it here, the coordinator (launch/coordinator.py) over the hosts' connections.

Pure glue: no I/O of its own, no thread; the caller holds whatever lock guards its job.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from heterps_paddle.launch import machine as m


class Records(Protocol):
    def actions(self, actions: Sequence[m.Action], job: m.Job) -> None: ...


def drive(
    job: m.Job,
    event: m.Event,
    clock: Callable[[], float],
    records: Records | None,
    carry_out: Callable[[m.Action, m.Job], m.Event | None],
    stepped: Callable[[m.Job, Sequence[m.Action]], None] | None = None,
) -> m.Job:
    """``event`` and whatever its actions lead to through the machine, from ``job``; the job after them.
    ``stepped`` sees each step's job and actions before they are carried out (the coordinator keeps the connection
    an event came on as a member's there)."""
    queue: list[m.Event] = [event]
    while queue:
        job, actions = m.step(job, queue.pop(0), clock())
        if stepped is not None:
            stepped(job, actions)
        if records is not None:
            records.actions(actions, job)
        for action in actions:
            follow = carry_out(action, job)
            if follow is not None:
                queue.append(follow)
    return job
