"""The process that runs Paddle's launcher for one round (or one attempt) of a host's launch, supervised.

``heterps launch`` (launch/driver.py) starts it in a session of its own, with the launcher's arguments; it sends a
RunResult (launch/result.py: facts, how the round ended here) to the driver and exits.  Across hosts it is the
coordinator's member for this round (launch/member.py): it joins before anything starts, reports what happened
(done, or a failure and whether it was Paddle's connect-timeout abort) and carries out what the coordinator says
(start, abort, end, a new round); after a failure it waits for that word, which only the coordinator's machine
decides.
"""

from __future__ import annotations

import os
import sys
import time

from heterps_paddle import settings
from heterps_paddle.launch.job import HostsJob, JobAborted
from heterps_paddle.launch.member import Member
from heterps_paddle.launch.result import RESULT_FD_ENV, Outcome, RunResult
from heterps_paddle.launch.supervisor import OWN_PREFIX, POLL_S, Failure, Supervisor, say
from heterps_paddle.rendezvous import LAUNCH_ID_ENV, RENDEZVOUS_ENV
from heterps_paddle.runtime import patches
from heterps_paddle.runtime.seam import PaddleBehaviourChanged


def main(launch_argv: list[str]) -> int:
    result_fd = os.environ.pop(RESULT_FD_ENV, None)  # not for the job's processes (Paddle logs their environment)
    result = run(launch_argv)
    result.send(result_fd)
    return 0 if result.outcome is Outcome.SUCCEEDED else 1


def run(launch_argv: list[str]) -> RunResult:
    """Run Paddle's launcher in this process, supervised: how it ended."""
    timeout = str(settings.get("HETERPS_LAUNCH_TIMEOUT"))
    member = None
    job = HostsJob.from_env()
    if job is not None:
        member = Member(job)
        say(f"{OWN_PREFIX} joining the launch's coordinator at {job.endpoint} (host {job.coordinator})")
        try:
            launch = member.join()
        except JobAborted as exc:
            member.close()
            return RunResult(Outcome.FAILED, f"the launch across hosts did not start: {exc}")
        # Every process of the job reads the launch's board there, and names the launch by the coordinator's id.
        os.environ[RENDEZVOUS_ENV] = job.endpoint
        os.environ[LAUNCH_ID_ENV] = launch
        say(f"{OWN_PREFIX} every host joined (launch {launch}); starting this host's processes")
    # Imported here: tools/cli.py imports the launch at start-up, and `heterps --help` must not import Paddle.
    # And after joining: importing Paddle takes seconds (tens on a busy machine), which the coordinator's
    # HETERPS_STARTUP_TIMEOUT would count against a host that is there (a suite run at load average 20-30 saw
    # the coordinator's own host reported as never joined within a test's 8 s).
    from paddle.distributed.fleet import launch as paddle_launch

    supervisor = Supervisor(float(timeout) if timeout else None, member)
    sys.argv = ["paddle.distributed.launch", *launch_argv]
    try:
        # Paddle's launcher tells the supervisor the processes it starts; its class is restored when it returns.
        with patches.supervised_launcher(supervisor.attach, supervisor.workers_started):
            paddle_launch.launch()
    except PaddleBehaviourChanged as exc:
        return RunResult(Outcome.FAILED, str(exc))
    finally:
        supervisor.stop()
    if supervisor.failure is None and supervisor.launcher is not None and (member is None or member.restart is None):
        failure = supervisor.after_the_launcher()
        if failure is not None:
            supervisor.fail(failure)
        supervisor.stop_all()
    if member is not None:
        if member.restart is None and supervisor.failure is not None:
            # What follows a failure is the coordinator's word (a new round, or the end): wait for it.
            while not member.settled():
                time.sleep(POLL_S)
        _end_membership(supervisor, member)
    failure = supervisor.failure
    told = None if member is None else member.restart
    if member is not None and told is not None:
        member.close()
    if failure is None and told is None:
        return RunResult(Outcome.SUCCEEDED)
    return RunResult(
        Outcome.FAILED if told is None else Outcome.NEW_ROUND,
        failure=None if failure is None else failure.message,
        log=None if failure is None else failure.log,
        connect_timeout=failure is not None and failure.connect_timeout is not None,
        told=told,
    )


def _end_membership(supervisor: Supervisor, member: Member) -> None:
    """Across hosts, after Paddle's launcher returned: a host whose processes all ended well says so and waits for
    the job's end (closing its connection earlier would read as a lost host); a failure was already reported."""
    if member.restart is not None:
        return  # the job starts again: this round's end is not the job's
    try:
        if supervisor.failure is None:
            member.report_done()
            while not member.settled():
                time.sleep(POLL_S)
            if member.restart is not None:
                return
            if member.aborted.is_set() and not member.ended.is_set():
                supervisor.fail(Failure(f"the launch across hosts ended: {member.abort_reason}"), report=False)
    finally:
        if member.restart is None:
            member.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
