"""runtime/push_queues.py: a PS client is flushed until the queue sizes its flushes log read empty.

The client here is a stand-in that writes the lines Paddle 2.6.2's ``BrpcPsClient::Flush`` writes (glog, on the
calling thread, to fd 2); the launched split tests (test_style_trainer, test_dropin_split) run the real one."""

import logging
import os
import subprocess
import sys
import textwrap
import threading

from heterps_paddle.runtime import push_queues


def _line(tid: int, table: int, size: int, source: int = 711) -> str:
    return f"I1124 21:09:12.871330  {tid} brpc_ps_client.cc:{source}] BrpcPsClient::PrintQueueSize: table {table} size: {size}\n"


class LoggingClient:
    """Each flush logs the next queue sizes of ``rounds`` (the last one again once they run out)."""

    def __init__(self, rounds):
        self.rounds = rounds
        self.flushes = 0

    def client_flush(self):
        sizes = self.rounds[min(self.flushes, len(self.rounds) - 1)]
        self.flushes += 1
        tid = threading.get_native_id()
        os.write(2, f"I1124 21:09:12.771226  {tid} brpc_ps_client.cc:684] BrpcPsClient::flush begin\n".encode())
        os.write(2, _line(tid + 1, 5, 7).encode())  # another thread's line: not this flush's
        for table, size in sizes.items():
            os.write(2, _line(tid, table, size, 704 if table == 0 else 711).encode())


def test_queue_sizes_are_read_from_the_flushing_threads_own_lines():
    log = (
        _line(7678, 0, 0, 704) + _line(7678, 6, 1) + "I1124 other line\n" + _line(7559, 6, 0) + _line(7678, 5, 2)
    ).encode()
    assert push_queues.queue_sizes(log, 7678) == {0: 0, 6: 1, 5: 2}
    assert push_queues.queue_sizes(log, 7559) == {6: 0}
    assert push_queues.queue_sizes(b"no flush here\n", 7678) == {}


def test_a_flush_that_leaves_pushes_queued_is_repeated_until_they_are_sent(caplog):
    client = LoggingClient([{0: 0, 5: 1, 6: 1}, {0: 0, 5: 0, 6: 1}, {0: 0, 5: 0, 6: 0}])
    with caplog.at_level(logging.INFO, logger="heterps"):
        assert push_queues.flush_until_empty(client, "test save", timeout_s=60) == 3
    assert client.flushes == 3
    assert "pushes still queued after a flush (table: tasks) {5: 1, 6: 1}" in caplog.text


def test_queues_that_never_read_empty_end_in_a_warning_not_a_hang(caplog):
    client = LoggingClient([{0: 0, 6: 2}])
    with caplog.at_level(logging.INFO, logger="heterps"):
        attempts = push_queues.flush_until_empty(client, "test save", timeout_s=0.2)
    assert attempts >= 2 and client.flushes == attempts
    assert "still queues pushes (table: tasks) {6: 2}" in caplog.text


def test_a_flush_that_logs_no_sizes_is_not_repeated():
    client = LoggingClient([{}])
    assert push_queues.flush_until_empty(client, "test save", timeout_s=60) == 1


def test_a_stderr_that_is_not_a_file_is_caught_for_the_flush_and_given_back():
    # A terminal or a pipe cannot be read back: fd 2 is swapped for a file during the flush, and what it caught is
    # written to the real stderr afterwards, in order, nothing lost.
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_push_queues import LoggingClient
        from heterps_paddle.runtime import push_queues
        os.write(2, b"before\\n")
        n = push_queues.flush_until_empty(LoggingClient([{{6: 1}}, {{6: 0}}]), "pipe", timeout_s=60)
        os.write(2, b"after\\n")
        print(n)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["2"]
    err = done.stderr.decode()
    assert err.startswith("before\n") and err.rstrip().endswith("after"), err
    assert err.count("BrpcPsClient::flush begin") == 2 and "table 6 size: 1" in err and "table 6 size: 0" in err


class SilentClient:
    def __init__(self):
        self.flushes = 0

    def client_flush(self):
        self.flushes += 1


def test_a_process_without_a_stderr_still_flushes_once():
    # fd 2 closed (a daemon): nothing to read the sizes from, so the one flush is made and not repeated.  The
    # process is a job's: its heterps logger configured as the meta optimizer does (to stdout), so the warning that
    # the flush cannot be checked reaches stdout and nothing is left for Python to flush into the closed fd 2 at exit
    # (which ends a process 120).  Whatever the caller's shell sets: buffered streams, as a plain shell has them.
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_push_queues import SilentClient
        from heterps_paddle import log
        from heterps_paddle.runtime import push_queues
        log.configure()
        os.close(2)
        client = SilentClient()
        print(push_queues.flush_until_empty(client, "closed", timeout_s=60), client.flushes)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode().splitlines()
    assert out[-1].split() == ["1", "1"]
    assert any("its flushes cannot be checked" in line for line in out[:-1]), out
