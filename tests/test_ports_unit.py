"""Ports a one-host launch claims (launch/ports.py): below the ephemeral range, never a port another launch holds
or a listener has, and given to Paddle's launcher as explicit endpoints (launch/driver.py)."""

import socket
import subprocess
import sys

import pytest

from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch import ports
from heterps_paddle.launch.ports import claim_port_block, ephemeral_low

LOCAL = "127.0.0.1"


class Draws:
    """A random.Random stand-in that draws the given first ports, in order."""

    def __init__(self, *firsts):
        self.firsts = list(firsts)

    def randrange(self, low, high):
        first = self.firsts.pop(0)
        assert low <= first < high
        return first


def free_first(count):
    block = claim_port_block(LOCAL, count)
    block.release()
    return block.first


def test_a_block_is_below_the_ephemeral_range_and_consecutive():
    block = claim_port_block(LOCAL, 6)
    try:
        assert ports.LOWEST_PORT <= block.first and block.first + 6 <= ephemeral_low()
        assert block.ports == list(range(block.first, block.first + 6))
    finally:
        block.release()


def test_a_port_claimed_by_another_process_is_skipped_until_released():
    first = free_first(3)
    block = claim_port_block(LOCAL, 3, rng=Draws(first))
    # The other process draws first and first + 1 (both overlap the held block), then at random: another launch on
    # this machine (a suite beside this one) may hold any fixed port beyond the block.
    other = (
        "import random\n"
        "from heterps_paddle.launch.ports import claim_port_block\n"
        f"class D:\n    firsts = [{first}, {first + 1}]\n"
        "    def randrange(self, low, high):\n"
        "        return self.firsts.pop(0) if self.firsts else random.randrange(low, high)\n"
        "d = D()\n"
        f"print(claim_port_block('{LOCAL}', 2, rng=d).first, len(d.firsts))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        got, left = (int(word) for word in done.stdout.split())
        assert left == 0  # both overlapping draws were tried, and skipped
        assert got + 2 <= first or got >= first + 3, (got, first)
    finally:
        block.release()
    again = claim_port_block(LOCAL, 3, rng=Draws(first))
    again.release()
    assert again.first == first


def test_a_port_with_a_listener_is_skipped():
    first = free_first(2)
    with socket.socket() as listener:
        listener.bind((LOCAL, first + 1))
        listener.listen()
        later = free_first(2)
        block = claim_port_block(LOCAL, 2, rng=Draws(first, later))
        block.release()
    assert block.first == later


def test_no_room_is_an_error_naming_the_range(tmp_path):
    bad = tmp_path / "range"
    bad.write_text("garbage\n")
    assert ephemeral_low(str(bad)) == ports.DEFAULT_EPHEMERAL_LOW
    narrow = tmp_path / "narrow"
    narrow.write_text(f"{ports.LOWEST_PORT + 2}\t60999\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ports, "EPHEMERAL_RANGE_FILE", str(narrow))
        mp.setattr(ports.ephemeral_low, "__defaults__", (str(narrow),))
        with pytest.raises(HeterPSError, match="ephemeral range"):
            claim_port_block(LOCAL, 4)


def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("")
    return str(path)


def test_a_launch_by_counts_gets_explicit_endpoints_from_its_claimed_block(tmp_path):
    from heterps_paddle.launch.options import parse
    from heterps_paddle.launch.paddle_round import with_claimed_ports

    train = script(tmp_path)
    argv = ["--server_num=1", "--worker_num=2", "--heter_worker_num=1;2", "--heter_devices=cpu;cpu", "--log_dir", "L"]
    options = parse([*argv, train, "--epochs", "2"])
    block, out = with_claimed_ports(options.paddle_arguments(), options)
    try:
        assert block is not None and block.count == 1 + 2 + 3 + 1
        args = out.paddle_arguments()
        p = block.ports
        assert args.servers == f"{LOCAL}:{p[0]}"
        assert args.workers == f"{LOCAL}:{p[1]},{LOCAL}:{p[2]}"
        assert args.heter_workers == f"{LOCAL}:{p[3]};{LOCAL}:{p[4]},{LOCAL}:{p[5]}"
        assert int(args.http_port) == p[6]
        assert args.training_script == train and args.training_script_args == ["--epochs", "2"]
        assert (args.server_num, args.worker_num, args.heter_worker_num) == (1, 2, "1;2")
    finally:
        if block is not None:
            block.release()


def test_a_launch_that_names_its_endpoints_is_left_as_it_is(tmp_path):
    from heterps_paddle.launch.options import parse
    from heterps_paddle.launch.paddle_round import with_claimed_ports

    options = parse(["--servers", "127.0.0.1:6170", "--workers", "127.0.0.1:6171", script(tmp_path)])
    assert with_claimed_ports(options.paddle_arguments(), options) == (None, options)


def test_a_restart_rounds_log_dir_replaces_the_launchers_and_leaves_the_scripts(tmp_path):
    """A round's ``--log_dir`` replaces the launcher's, even when an option's value stands apart (``--log_dir L``,
    ``--server_num 1``), and the script's own ``--log_dir`` is not the launcher's."""
    from heterps_paddle.launch.options import parse

    train = script(tmp_path)
    argv = ["--server_num", "1", "--worker_num", "2", "--log_dir", "L", train, "--log_dir", "mine", "x"]
    out = parse(argv).with_paddle({"--log_dir": "L/round1"})
    args = out.paddle_arguments()
    assert args.log_dir == "L/round1" and (args.server_num, args.worker_num) == (1, 2)
    assert args.training_script == train and args.training_script_args == ["--log_dir", "mine", "x"]
    assert "--log_dir=L" not in out.launcher_argv()


def test_a_standing_by_hosts_log_dir_is_the_launchers_not_the_scripts(tmp_path):
    from heterps_paddle.launch.options import parse

    train = script(tmp_path)
    assert parse(["--server_num", "1", "--worker_num", "1", train, "--log_dir", "mine"]).log_dir == "log"
    assert parse(["--quiet", "--log_dir=L", "--server_num=1", "--worker_num=1", train]).log_dir == "L"
