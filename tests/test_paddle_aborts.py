"""Telling Paddle's connect-timeout abort from a process's log (launch/paddle_aborts.py)."""

from heterps_paddle.launch.paddle_aborts import TAIL_BYTES, connect_timeout_abort

# The lines a heterogeneous trainer left in a suite run of 2026-11-24 (tests/test_across_hosts.py, host 127.0.0.4)
PADDLE_ABORT = """\
I1124 22:55:40.918823  5059 heter_section_worker.cc:421] one batch run over! micro_id: 0 batch_num: 1
terminate called after throwing an instance of 'phi::enforce::EnforceNotMet'
  what():  (Unimplemented) HeterClient::SendAndRecv meets brpc error, error message is [E110]Fail to connect \
Socket{id=7 addr=127.0.0.3:19128} (0x0x555b9cd729c0): Connection timed out [R1][E112]Not connected to \
127.0.0.3:19128 yet, server_id=7 [R2][E112]Not connected to 127.0.0.3:19128 yet, server_id=7
  [Hint: Expected closure->cntl.Failed() != true, but received closure->cntl.Failed():1 == true:1.] (at \
/paddle/paddle/fluid/distributed/ps/service/heter_client.cc:139)
FatalError: `Process abort signal` is detected by the operating system.
"""


def test_the_abort_and_its_peer_are_read_from_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "heterlog.0"
    log.write_text("x" * (3 * TAIL_BYTES) + "\n" + PADDLE_ABORT)
    found = connect_timeout_abort(str(log))
    assert found is not None and found.peer == "127.0.0.3:19128"
    assert "127.0.0.3:19128" in found.describe() and "200 ms" in found.describe()


def test_other_ends_are_not_taken_for_it(tmp_path):
    refused = PADDLE_ABORT.replace("[E110]Fail to connect", "[E111]Fail to connect")
    for name, text in (("refused", refused), ("killed", "heterps: serving\n"), ("empty", "")):
        log = tmp_path / name
        log.write_text(text)
        assert connect_timeout_abort(str(log)) is None, name
    assert connect_timeout_abort(str(tmp_path / "missing")) is None
    assert connect_timeout_abort(None) is None
