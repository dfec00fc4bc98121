import os

import pytest

from heterps_paddle.data.criteo import (
    NUM_DENSE,
    NUM_SPARSE,
    DataFormatError,
    convert_file,
    parse_line,
    read_all,
    read_samples,
)
from heterps_paddle.data.dataset import NotEnoughFiles, prepare_multislot, shard


def good_line(label=1, first_id=5):
    dense = " ".join(f"dense_feature:{i / 10}" for i in range(NUM_DENSE))
    sparse = " ".join(f"{slot}:{first_id + slot}" for slot in range(1, NUM_SPARSE + 1))
    return f"click:{label} {dense} {sparse}"


def write(tmp_path, lines, name="part-0"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_reads_the_real_criteo_sample(criteo_sample):
    samples, report = read_all([criteo_sample])
    assert len(samples) == report.rows == 80 and report.skipped == 0
    first = samples[0]
    assert first.label == 0
    assert first.dense[1] == pytest.approx(0.00497512437811)
    assert first.sparse[0] == (737395,) and first.sparse[25] == (306163,)
    assert {s.label for s in samples} == {0, 1}
    assert all(len(s.dense) == NUM_DENSE and len(s.sparse) == NUM_SPARSE for s in samples)


def test_multi_hot_slots_are_kept():
    sample = parse_line(good_line() + " 3:77")
    assert sample.sparse[2] == (8, 77)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda line: line.replace("dense_feature:0.3", "dense_feature:abc"), "is not a number"),
        (lambda line: line.replace("dense_feature:0.3", "dense_feature:nan"), "not a finite number"),
        (lambda line: line.replace(" 7:12", ""), "missing sparse slot(s) 7"),
        (lambda line: line.replace(" 7:12", " 7:x12"), "id 'x12' is not an integer"),
        (lambda line: line.replace(" 7:12", " 7:-3"), "outside 0..2^63-1"),
        (lambda line: line.replace(" 7:12", " 7:9223372036854775808"), "outside 0..2^63-1"),
        (lambda line: line.replace(" 7:12", " 7"), "bad token '7'"),
        (lambda line: line.replace(" 7:12", " 27:12"), "unknown slot '27'"),
        (lambda line: line.replace("click:1", "click:2"), "click must be 0 or 1"),
        (lambda line: line.replace("click:1 ", ""), "missing click"),
        (lambda line: line + " click:0", "more than one click"),
        (lambda line: line.replace("dense_feature:0.3 ", ""), "expected 13 dense_feature values, got 12"),
    ],
)
def test_malformed_lines_stop_with_file_and_line(tmp_path, mutate, reason):
    path = write(tmp_path, [good_line(), good_line(0), mutate(good_line())])
    with pytest.raises(DataFormatError) as err:
        list(read_samples(path))
    assert f"{path}:3:" in str(err.value)
    assert reason in str(err.value)


def test_malformed_lines_are_skipped_and_counted_when_asked(tmp_path):
    path = write(tmp_path, [good_line(), "click:1 garbage", "", good_line(0), good_line().replace(" 9:14", "")])
    samples, report = read_all([path], skip_malformed=True)
    assert [s.label for s in samples] == [1, 0]
    assert report.rows == 2 and report.skipped == 2
    assert report.first_errors[0].startswith(f"{path}:2:")
    assert report.first_errors[1].startswith(f"{path}:5:")


def test_not_utf8_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes((good_line() + "\n").encode() + b"click:\xff\xfe\n")
    with pytest.raises(DataFormatError, match=r"bad:2: not UTF-8"):
        list(read_samples(str(path)))


def test_conversion_writes_multislot_in_feed_order(tmp_path, criteo_sample):
    dst = str(tmp_path / "out")
    report = convert_file(criteo_sample, dst)
    lines = open(dst).read().splitlines()
    assert report.rows == len(lines) == 80
    tokens = lines[0].split()
    assert tokens[0] == "13" and float(tokens[2]) == pytest.approx(0.00497512437811)
    assert tokens[14:16] == ["1", "737395"]  # first sparse slot after the 13 dense values
    assert tokens[-2:] == ["1", "0"]  # label last
    assert len(tokens) == 1 + 13 + 2 * 26 + 2


def test_failed_conversion_leaves_nothing_behind(tmp_path):
    src = write(tmp_path, [good_line(), "click:1 nonsense"])
    dst = tmp_path / "converted"
    with pytest.raises(DataFormatError):
        convert_file(src, str(dst))
    assert not dst.exists() and not list(tmp_path.glob("converted*"))


def test_prepared_files_are_cached_and_reconverted_when_the_source_changes(tmp_path):
    src = write(tmp_path, [good_line(), good_line(0)])
    cache = str(tmp_path / "cache")
    (first,), report = prepare_multislot([src], root=cache)
    assert report.rows == 2
    mtime = os.stat(first).st_mtime_ns
    (again,), report = prepare_multislot([src], root=cache)
    assert again == first and os.stat(again).st_mtime_ns == mtime and report.rows == 2
    write(tmp_path, [good_line(), good_line(0), good_line(1)])
    (changed,), report = prepare_multislot([src], root=cache)
    assert changed != first and report.rows == 3


def test_skip_report_survives_the_cache(tmp_path):
    src = write(tmp_path, [good_line(), "junk"])
    cache = str(tmp_path / "cache")
    for _ in range(2):
        _, report = prepare_multislot([src], skip_malformed=True, root=cache)
        assert report.rows == 1 and report.skipped == 1


def test_sharding_needs_a_file_per_worker():
    assert shard(["a", "b", "c"], 1, 2) == ["b"]
    with pytest.raises(NotEnoughFiles, match="1 data file\\(s\\) for 2 workers"):
        shard(["a"], 0, 2)
