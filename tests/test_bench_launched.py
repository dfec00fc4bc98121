"""What the launched benchmarks share (tools/bench/launched.py): the work directory outlives a failure, and only a
failure or --keep; SIGTERM is the benchmark's only while it runs."""

import os
import signal

import pytest

from heterps_paddle.tools.bench.launched import work_dir


def test_the_work_directory_is_removed_kept_when_asked_and_kept_on_a_failure(capsys):
    before = signal.getsignal(signal.SIGTERM)
    with work_dir("unit", keep=False) as work:
        assert os.path.isdir(work.path) and "heterps-bench-unit-" in work.path
        assert signal.getsignal(signal.SIGTERM) is not before
    assert not os.path.exists(work.path) and not work.kept
    assert signal.getsignal(signal.SIGTERM) is before

    with work_dir("unit", keep=True) as kept:
        pass
    assert os.path.isdir(kept.path)
    os.rmdir(kept.path)

    with pytest.raises(RuntimeError, match="a job failed"):
        with work_dir("unit", keep=False) as failed:
            raise RuntimeError("a job failed")
    assert failed.kept and os.path.isdir(failed.path)
    assert f"bench unit: failed; its work directory is kept: {failed.path}" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
    os.rmdir(failed.path)
