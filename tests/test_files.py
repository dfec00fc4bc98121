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
