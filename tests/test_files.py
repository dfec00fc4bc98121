"""files.replace_atomic and its users: a file is the old one or the whole new one, and a failed write leaves
neither a partial file nor its temporary."""

import os

import pytest

from heterps_paddle.files import replace_atomic, save_figure_atomic, write_atomic


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "plan.json")
    write_atomic(path, "old")

    def dies_half_way(tmp):
        with open(tmp, "w") as f:
            f.write("half of the ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_atomic(path, dies_half_way)
    assert open(path).read() == "old"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_a_figure_is_written_in_the_format_of_its_name(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure()
    for name, magic in (("sweep.png", b"\x89PNG"), ("sweep.svg", b"<?xml")):
        save_figure_atomic(figure, str(tmp_path / name))
        assert open(tmp_path / name, "rb").read(5).startswith(magic)
    assert sorted(os.listdir(tmp_path)) == ["sweep.png", "sweep.svg"]


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "{log}", "--plot", "{out}"],
        ["plan", "--model", "{profile}", "--cluster", "{cluster}", "--plot", "{out}"],
    ],
    ids=["status", "plan"],
)
def test_every_plot_without_matplotlib_says_in_one_line_what_to_install(tmp_path, monkeypatch, capsys, argv):
    """Issue 53: `heterps status log --plot` after the README's install (no matplotlib) ended in a traceback; every
    --plot goes through one check that names the extra."""
    import sys

    from heterps_paddle.launch.event_log import EventLog
    from heterps_paddle.tools.cli import main

    EventLog(str(tmp_path)).write("launch_started", host="127.0.0.1", pid=1, across_hosts=False, version="x")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = {
        "log": str(tmp_path),
        "out": str(tmp_path / "figure.png"),
        "profile": os.path.join(repo, "examples", "profiles", "dlrm_criteo_1tb.yaml"),
        "cluster": os.path.join(repo, "examples", "clusters", "cloud_mixed.yaml"),
    }
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    code = main([a.format(**paths) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and "--plot needs matplotlib, which is not installed: pip install 'heterps-paddle[plot]'" in err
    assert "Traceback" not in err and not os.path.exists(paths["out"])
