"""The one place a job's machine is stepped (launch/shell.py), as one host's launch uses it: an event through the
machine, each step's records written before its actions are carried out, and what an action leads to fed back."""

from heterps_paddle.launch import machine as m
from heterps_paddle.launch.shell import drive

HOST = "127.0.0.1"


def test_a_retry_on_one_host_is_replanned_through_what_its_shell_answers():
    rules = m.Rules(connect_retries=1, settle_s=0.0, can_replan=True)
    job = m.first_job(rules, m.Round(0, {HOST: True}, HOST, ""), 0.0)
    log, carried = [], []

    class Records:
        def actions(self, actions, job):
            log.append((job.round.number, [type(a).__name__ for a in actions]))

    def carry_out(action, job):
        carried.append(type(action).__name__)
        if isinstance(action, m.Replan):  # the shell's answer: the same plan, fed back as the next event
            r = job.round
            return m.Planned({}, r.members, r.coordinator, r.digest, {"summary": "same", "how": "test"}, {}, "now")
        return None

    seen = []
    job = drive(job, m.Joined(HOST, ""), lambda: 1.0, Records(), carry_out, lambda j, a: seen.append(j.state))
    assert job.state is m.JobState.RUNNING and carried == ["Start"]
    job = drive(
        job, m.ProcessFailed(HOST, 0, "Paddle's connect-timeout abort", True), lambda: 2.0, Records(), carry_out
    )
    job = drive(job, m.Tick(), lambda: 3.0, Records(), carry_out)  # settled: a new round asked for
    # the failure asked for a new round; the answer (Planned) went through the machine in the same drive
    assert "Replan" in carried and job.round.number == 1 and job.round.retries_used == 1, (carried, job.round)
    assert [n for n, _ in log][-1] == 1 and seen[0] is m.JobState.RUNNING  # records written with the job after
