"""Every bad path is a one-line error: each path option of ``heterps launch-args``, ``plan``, ``eval``, ``profile``,
``gen-data``, ``local-cluster``, ``status`` and ``bench ...``, given a file where a directory is needed, a directory under a
file, a directory where a file is needed, a place nothing can be written, or a missing input, exits 2 with one line
that names the option, the path and what is wrong (files.py's input_file, input_dir, output_dir, output_file), and
before any work starts: the commands' work is replaced here by a function that fails the test.

``heterps launch`` is not here (its own tests).  In-process through conftest.run_cli, but for one case run as a user
runs it, to see no traceback on stderr.
"""

import argparse
import json
import os
import stat
import subprocess
import tempfile

import pytest
from conftest import CLUSTER, REPO, heterps_cli, run_cli

from heterps_paddle.errors import EXIT_INPUT_ERROR, CommandError
from heterps_paddle.files import input_dir, input_file, output_dir, output_file
from heterps_paddle.tools.cli import build_parser

HOSTS = os.path.join(REPO, "examples", "clusters", "dlrm_aws_hosts.yaml")
# A plan whose resource types the hosts file (and its cluster, dlrm_aws.yaml) names.
HOSTS_PLAN = {
    "format": 1,
    "feasible": True,
    "stages": [
        {"resource": "cpu_r6i_8xl", "kind": "cpu", "layers": ["a"], "units": 3},
        {"resource": "gpu_t4", "kind": "gpu", "layers": ["b"], "units": 1},
    ],
}

# (command, option, kind, argv with PATH where the option's path goes); every other argument is good.
IN_FILE, IN_DIR, OUT_DIR, OUT_FILE = "input file", "input directory", "output directory", "output file"
OPTIONS = [
    ("launch-args", "plan", IN_FILE, ["launch-args", "PATH"]),
    ("launch-args", "--cluster", IN_FILE, ["launch-args", "{plan}", "--cluster", "PATH"]),
    ("launch-args", "--hosts", IN_FILE, ["launch-args", "{hosts_plan}", "--hosts", "PATH"]),
    (
        "launch-args",
        "--k8s",
        OUT_DIR,
        ["launch-args", "{hosts_plan}", "--hosts", "{hosts}", "--k8s", "PATH", "--image", "img:1", "--train", "t.py"],
    ),
    ("plan", "--model", IN_FILE, ["plan", "--model", "PATH", "--cluster", CLUSTER, "--scheduler", "exact"]),
    ("plan", "--cluster", IN_FILE, ["plan", "--model", "{model}", "--cluster", "PATH"]),
    ("plan", "--out", OUT_FILE, ["plan", "--model", "{model}", "--cluster", CLUSTER, "--out", "PATH"]),
    ("plan", "--plot", OUT_FILE, ["plan", "--model", "{model}", "--cluster", CLUSTER, "--plot", "PATH"]),
    ("eval", "--model", IN_DIR, ["eval", "--model", "PATH"]),
    ("eval", "--config", IN_FILE, ["eval", "--model", "{saved}", "--config", "PATH"]),
    ("eval", "--log-dir", OUT_DIR, ["eval", "--model", "{saved}", "--log-dir", "PATH"]),
    ("profile", "--out", OUT_FILE, ["profile", "--example", "ctr_dnn", "--out", "PATH"]),
    ("gen-data", "--out", OUT_DIR, ["gen-data", "--rows", "10", "--out", "PATH"]),
    ("local-cluster", "--out", OUT_FILE, ["local-cluster", "--out", "PATH"]),
    ("local-cluster", "--ssd-dir", OUT_DIR, ["local-cluster", "--out", "{cluster_out}", "--ssd-dir", "PATH"]),
    ("status", "log_dir", IN_DIR, ["status", "PATH"]),
    ("status", "--plot", OUT_FILE, ["status", "{job_log}", "--plot", "PATH"]),
    ("bench scheduler", "--plot", OUT_FILE, ["bench", "scheduler", "--no-examples", "--plot", "PATH"]),
    ("bench table", "--ssd-dir", OUT_DIR, ["bench", "table", "--ssd-dir", "PATH"]),
    ("bench sections", "--work-dir", OUT_DIR, ["bench", "sections", "--work-dir", "PATH"]),
    ("bench hosts", "--work-dir", OUT_DIR, ["bench", "hosts", "--work-dir", "PATH"]),
]

# Named by the loader's words alone ('PATH: file does not exist'), not the option's: strategy.heterps_configs gives
# the same for its 'cluster' key, and tests/test_bad_input.py holds the two to be one message.
LOADER_WORDS = {("plan", "--cluster")}

# The work each command does once its arguments are checked: none of it may start on a bad path.
WORK = {
    "heterps_paddle.tools.launch_args": ["load_plan", "launch_arguments"],
    "heterps_paddle.tools.plan_command": ["make_plans", "budget_plan"],
    "heterps_paddle.tools.eval_command": ["launch"],
    "heterps_paddle.tools.profile_command": ["profile_example"],
    "heterps_paddle.tools.gen_data_command": ["generate"],
    "heterps_paddle.tools.local_cluster_command": ["detect_local_cluster"],
    "heterps_paddle.tools.status_command": ["of_log"],
    "heterps_paddle.tools.bench.scheduler": ["workload_suite", "run_suite"],
    "heterps_paddle.tools.bench.table": ["_make_table"],
    "heterps_paddle.tools.bench.sections": ["_run_one"],
    "heterps_paddle.tools.bench.hosts": ["check_can_shape", "measure_inputs"],
}


def _walk(parser, command):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{command} {name}".strip())
        elif action.choices is None and (
            action.dest in ("out", "plot", "model", "cluster", "hosts", "k8s", "config", "plan")
            or action.dest.endswith("_dir")
        ):
            yield command, (action.option_strings or [action.dest])[-1]


def test_every_path_option_is_covered():
    """A path option added to a command must join OPTIONS (so its bad paths are tested) or be named here."""
    found = set(_walk(build_parser(), ""))
    assert found == {(command, option) for command, option, _, _ in OPTIONS}


def _cannot_write_in(directory):
    try:
        handle, probe = tempfile.mkstemp(dir=directory)
    except OSError:
        return True
    os.close(handle)
    os.unlink(probe)
    return False


@pytest.fixture
def places(tmp_path, model_file):
    """Good inputs, and bad places of each kind."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**HOSTS_PLAN, "stages": [{**HOSTS_PLAN["stages"][0], "resource": "cpu"}]}))
    hosts_plan = tmp_path / "hosts_plan.json"
    hosts_plan.write_text(json.dumps(HOSTS_PLAN))
    # a copy of the example hosts file: launch-args makes the job's key beside the hosts file it is given
    hosts = tmp_path / "hosts.yaml"
    cluster = os.path.join(os.path.dirname(HOSTS), "dlrm_aws.yaml")
    hosts.write_text(open(HOSTS).read().replace("cluster: dlrm_aws.yaml", f"cluster: {cluster}"))
    job_log = tmp_path / "job_log"  # a launch's --log_dir: its event log
    job_log.mkdir()
    (job_log / "heterps-events.jsonl").write_text("")
    saved = tmp_path / "saved"
    (saved / "dnn_plugin").mkdir(parents=True)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    read_only = tmp_path / "read_only"  # unwritable to anyone but root: root gets /proc, where nothing is made
    read_only.mkdir(mode=stat.S_IRUSR | stat.S_IXUSR)
    unwritable = next((str(d) for d in (read_only, "/proc") if os.path.isdir(d) and _cannot_write_in(d)), None)
    yield {
        "good": {
            "plan": str(plan),
            "hosts_plan": str(hosts_plan),
            "hosts": str(hosts),
            "model": model_file,
            "saved": str(saved),
            "cluster_out": str(tmp_path / "cluster.yaml"),
            "job_log": str(job_log),
        },
        "file": str(a_file),
        "dir": str(a_dir),
        "missing": str(tmp_path / "missing"),
        "unwritable": unwritable,
    }
    read_only.chmod(stat.S_IRWXU)


def bad_paths(kind, places):
    """(path, what the line must say) for each bad path an option of this kind can be given."""
    f, d, missing, ro = places["file"], places["dir"], places["missing"], places["unwritable"]
    if kind == IN_FILE:
        cases = [
            (missing, "file does not exist"),
            (d, "is a directory, not a file"),
            (f"{f}/sub", f"file does not exist ({f} is a file, not a directory)"),
        ]
    elif kind == IN_DIR:
        cases = [
            (missing, "directory does not exist"),
            (f, "is a file, not a directory"),
            (f"{f}/sub", f"directory does not exist ({f} is a file, not a directory)"),
        ]
    elif kind == OUT_DIR:
        cases = [
            (f, "is a file, not a directory"),
            (f"{f}/sub", f"cannot be made: {f} is a file, not a directory"),
            (f"{f}/sub/deeper", f"cannot be made: {f} is a file, not a directory"),
        ]
        if ro:
            cases += [(ro, "is not writable"), (f"{ro}/sub", f"cannot be made: {ro} is not writable")]
    else:
        cases = [
            (d, "is a directory, not a file"),
            (f"{missing}/", "names a directory"),
            (f"{f}/out.yaml", f"{f} is a file, not a directory"),
            (f"{f}/sub/out.yaml", f"{f}/sub cannot be made: {f} is a file, not a directory"),
        ]
        if ro:
            cases += [(f"{ro}/out.yaml", f"{ro} is not writable"), (f"{ro}/sub/out.yaml", f"{ro} is not writable")]
    return cases


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("work started before the paths were checked")

    for module, names in WORK.items():
        for name in names:
            monkeypatch.setattr(f"{module}.{name}", refuse)


@pytest.mark.parametrize(
    "command, option, kind, argv", OPTIONS, ids=[f"{c} {o}".replace(" ", "-") for c, o, _, _ in OPTIONS]
)
def test_a_bad_path_is_one_line_naming_the_option(capsys, places, no_work, command, option, kind, argv):
    for path, words in bad_paths(kind, places):
        line = [path if a == "PATH" else a.format(**places["good"]) for a in argv]
        before = sorted(os.listdir(os.path.dirname(places["file"])))
        code, out, err = run_cli(capsys, *line)
        assert code == EXIT_INPUT_ERROR, (line, out, err)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (line, err)
        named = "" if (command, option) in LOADER_WORDS else f"{option} "
        assert err.startswith(f"heterps {command.split()[0]}: error: {named}{path}: "), (line, err)
        assert (words if named else words.split(" (")[0]) in err, (line, err)
        # nothing made beside the bad places
        assert sorted(os.listdir(os.path.dirname(places["file"]))) == before, line


def test_as_a_user_runs_it_there_is_no_traceback(places):
    out_under_a_file = f"{places['file']}/data"
    done = subprocess.run(
        heterps_cli() + ["gen-data", "--rows", "10", "--out", out_under_a_file],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_INPUT_ERROR and done.stdout == ""
    assert done.stderr == (
        f"heterps gen-data: error: --out {out_under_a_file}: cannot be made: {places['file']} is a file, "
        "not a directory\n"
    )


# ------------------------------------------------------------------ the helpers themselves


def test_the_helpers_return_a_good_path_and_make_what_is_missing(tmp_path):
    good = tmp_path / "in.yaml"
    good.write_text("x: 1\n")
    assert input_file("--in", str(good)) == str(good)
    assert input_dir("--in", str(tmp_path)) == str(tmp_path)
    assert output_dir("--out", str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    assert output_file("--out", str(tmp_path / "c" / "d.json")) == str(tmp_path / "c" / "d.json")
    assert (tmp_path / "c").is_dir() and not (tmp_path / "c" / "d.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["a", "c", "in.yaml"]  # no write check left behind
    assert os.listdir(tmp_path / "c") == []


def test_the_helpers_raise_a_command_error(tmp_path):
    for check in (input_file, input_dir):
        with pytest.raises(CommandError, match=f"^--x {tmp_path}/nope: .*does not exist$"):
            check("--x", str(tmp_path / "nope"))
    (tmp_path / "f").write_text("")
    for check in (output_dir, output_file):
        with pytest.raises(CommandError, match=f"^--x {tmp_path}/f/g: .*{tmp_path}/f is a file, not a directory$"):
            check("--x", str(tmp_path / "f" / "g"))
