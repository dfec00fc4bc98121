import json
import subprocess

from conftest import heterps_cli


def cli(*args):
    return subprocess.run(heterps_cli() + list(args), capture_output=True, text=True, timeout=120)


def test_help_lists_the_commands():
    result = cli("--help")
    assert result.returncode == 0
    for command in ("gen-data", "bench"):
        assert command in result.stdout


def test_subcommand_help():
    for args in (("gen-data", "--help"), ("bench", "e2e", "--help")):
        result = cli(*args)
        assert result.returncode == 0 and "usage: heterps" in result.stdout


def test_gen_data_writes_and_reports(tmp_path):
    result = cli("gen-data", "--rows", "500", "--out", str(tmp_path / "d"), "--seed", "2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["train_rows"] == 500 and summary["test_rows"] == 50 and summary["train_files"] == 8
    assert (tmp_path / "d" / "train" / "part-00000").is_file()


def test_user_errors_exit_2_without_traceback(tmp_path):
    result = cli("gen-data", "--rows", "-5", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "--rows must be positive" in result.stderr and "Traceback" not in result.stderr


def test_local_cluster_file_is_a_valid_cluster(tmp_path):
    from heterps_paddle.planning.model import load_cluster

    out = tmp_path / "local.yaml"
    result = cli("local-cluster", "--out", str(out), "--throughput", "5000")
    assert result.returncode == 0, result.stderr
    cluster = load_cluster(str(out))
    assert cluster.throughput == 5000
    assert [(t.name, t.kind) for t in cluster.resource_types] == [("local_cpu", "cpu"), ("local_gpu", "gpu")]
    for t in cluster.resource_types:
        assert t.max_units >= 1 and t.flops > 1e8 and t.mem_bw > 1e7 and t.net_bw > 1e7 and t.memory > 1e8


def test_the_cli_runs_from_a_source_checkout():
    # `python -m heterps_paddle` in the repository's root imports the source tree, which has no
    # heterps_paddle.examples (setup.py maps examples/ to it on install): the CLI and `heterps plan` (which a
    # job runs for its report) must not need it at start-up.
    import sys

    from conftest import REPO

    for args in (["--help"], ["plan", "--help"], ["launch-args", "--help"]):
        run = subprocess.run(
            [sys.executable, "-m", "heterps_paddle", *args], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr[-2000:]
