"""``heterps launch``'s command line (launch/options.py) against Paddle's own parser, and its path options: each bad
one is a one-line error naming the option (exit 2), before anything starts."""

import os
import subprocess
import sys

import pytest

from heterps_paddle.launch.options import OWN_FLAGS, OWN_VALUED, PADDLE_VALUED


def paddles_options():
    """The options of Paddle's legacy launcher's parser (fleet/launch.py: _parse_args), as the installed Paddle has
    them, and whether each takes a value."""
    import argparse

    from paddle.distributed.fleet import launch as paddle_launch

    seen = {}
    original = argparse.ArgumentParser.parse_known_args

    def capture(self, args=None, namespace=None):
        for action in self._actions:
            for option in action.option_strings:
                seen[option] = action.nargs != 0
        return original(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = capture
    saved = sys.argv
    try:
        sys.argv = ["paddle.distributed.launch", "train.py"]
        paddle_launch._parse_args()
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved
    return seen


def test_every_paddle_launcher_option_is_known_and_takes_a_value():
    found = paddles_options()
    found.pop("-h")
    found.pop("--help")
    # Paddle's --host (its elastic mode) is heterps launch's own: this host's address across hosts
    assert set(found) - {"--host"} <= set(PADDLE_VALUED), set(found) - set(PADDLE_VALUED)
    assert all(found.values()), found
    assert not (set(OWN_VALUED) | set(OWN_FLAGS)) & (set(found) - {"--host"})


def launch(*argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "heterps_paddle.tools.launch", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("option", ["--log_dir", "--checkpoint-dir"])
def test_a_bad_directory_is_one_line_naming_the_option(tmp_path, option):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "afile").write_text("")
    for bad in ("afile", "afile/under", "/proc/heterps-nope"):
        done = launch("--server_num=1", "--worker_num=1", option, bad, "train.py", cwd=tmp_path)
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and option in lines[0] and bad in lines[0], (bad, done.stderr)
        assert "Traceback" not in done.stderr + done.stdout


def test_a_launch_across_hosts_without_the_jobs_key_refuses_to_start(tmp_path):
    """No insecure default: without the key file, or with one others can read, exit 2 saying how to make one."""
    import json
    import os

    (tmp_path / "train.py").write_text("")
    (tmp_path / "plan.json").write_text(
        json.dumps(
            {"format": 1, "feasible": True, "stages": [{"resource": "cpu", "kind": "cpu", "layers": ["x"], "units": 1}]}
        )
    )
    (tmp_path / "hosts.yaml").write_text(
        "format: 1\nhosts:\n  - {address: 127.0.0.2, type: cpu, servers: 1, port: 36100}\n"
    )
    argv = ["--hosts", "hosts.yaml", "--plan", "plan.json", "--host", "127.0.0.2", "--log_dir", "log", "train.py"]
    done = launch(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "hosts.yaml.key does not exist: make it with `heterps launch-args PLAN --hosts HOSTS`" in done.stderr
    key = tmp_path / "hosts.yaml.key"
    key.write_text("ab" * 32 + "\n")
    os.chmod(key, 0o644)
    done = launch(*argv, cwd=tmp_path)
    assert done.returncode == 2 and "can be read by others (mode 0644): `chmod 600" in done.stderr, done.stderr
    assert "ab" * 32 not in done.stdout + done.stderr


def test_join_says_what_a_machine_from_outside_the_hosts_file_is(tmp_path):
    from heterps_paddle.launch.options import OptionsError, parse

    script = tmp_path / "train.py"
    script.write_text("")
    base = ["--hosts", "h.yaml", "--plan", "p.json"]
    parsed = parse([*base, "--join", "type=gpu_fast,units=2,port=36100", str(script)])
    assert parsed.hosts.join == {"type": "gpu_fast", "units": 2, "port": 36100}
    assert parse([*base, "--join=type=cpu", str(script)]).hosts.join == {"type": "cpu"}
    for bad, says in (
        ("units=2", "needs type=TYPE"),
        ("type=gpu,units=x", "is not a number"),
        ("type=gpu,color=red", "bad item 'color=red'"),
        ("type=gpu,type=cpu", "bad item 'type=cpu'"),
        ("type=", "bad item 'type='"),
    ):
        with pytest.raises(OptionsError, match=says):
            parse([*base, "--join", bad, str(script)])


def test_leave_without_a_running_launch_is_an_error_naming_the_directory(tmp_path):
    from heterps_paddle.launch.leave import is_leave, leave_command

    assert is_leave(["--leave", "--log_dir", "log"]) and is_leave(["--log_dir=log", "--leave"])
    assert not is_leave(["--log_dir", "log", "train.py", "--leave"])  # the script's own --leave

    assert leave_command(["--leave", "--log_dir", str(tmp_path)]) == 2
    assert leave_command(["--leave"]) == 2
    from heterps_paddle.launch.event_log import EventLog

    log = EventLog(str(tmp_path))
    log.write("launch_started", host="127.0.0.2", pid=os.getpid(), across_hosts=True, version="x")
    log.write("host_ended", how="finished", code=0, reason="")
    assert leave_command(["--leave", f"--log_dir={tmp_path}"]) == 2  # it ended


def test_an_adapt_that_cannot_act_is_said_at_launch_with_what_would_let_it(tmp_path):
    """--adapt on / --on-scale on one host, or across hosts without --checkpoint-dir, did nothing silently."""
    from dataclasses import replace

    from heterps_paddle.launch.driver import why_adapt_cannot_act
    from heterps_paddle.launch.options import HostsOptions, parse

    script = tmp_path / "train.py"
    script.write_text("")
    one = parse(["--log_dir", str(tmp_path / "log"), "--adapt", "on", str(script)])
    assert "--adapt on does nothing on one host" in why_adapt_cannot_act(one)
    assert "--on-scale does nothing on one host" in why_adapt_cannot_act(replace(one, adapt="advise", on_scale="x"))
    assert why_adapt_cannot_act(replace(one, adapt="advise")) is None  # the default says nothing on one host
    across = replace(one, hosts=HostsOptions("hosts.yaml", "plan.json"))
    assert "without --checkpoint-dir: the job cannot move" in why_adapt_cannot_act(across)
    assert why_adapt_cannot_act(replace(across, checkpoint_dir=str(tmp_path / "c"))) is None
