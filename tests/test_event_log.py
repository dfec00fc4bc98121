"""The job's event log (launch/event_log.py): its records written whole and read back, a cut last line skipped, the
newest launch's records apart, and the schema in the code the one docs/event-log.md documents."""

import json
import os
import re

import pytest
from conftest import REPO

from heterps_paddle.launch import event_log


def test_records_are_written_whole_and_read_back_in_order(tmp_path):
    log = event_log.EventLog(str(tmp_path))
    log.write("launch_started", host="127.0.0.2", pid=1, across_hosts=True, version="x")
    log.write("host_round", round=0, part="runs", log_dir="log")
    with open(event_log.path_in(str(tmp_path)), "a") as f:
        f.write('{"v": 1, "type": "host_ended", "how"')  # a record still being written
    records = event_log.read(str(tmp_path))
    assert [r["type"] for r in records] == ["launch_started", "host_round"]
    assert all(r["v"] == event_log.VERSION and isinstance(r["t"], float) for r in records)


def test_foreign_lines_are_skipped_and_the_newest_launch_is_apart(tmp_path):
    path = event_log.path_in(str(tmp_path))
    with open(path, "w") as f:
        f.write("garbage\n[1, 2]\n" + json.dumps({"v": 99, "type": "launch_started"}) + "\n")
        f.write(json.dumps({"v": 1, "t": 1.0, "type": "no_such_type"}) + "\n")
    log = event_log.EventLog(str(tmp_path))
    log.write("launch_started", host="a", pid=1, across_hosts=False, version="x")
    log.write("host_ended", how="failed", code=1, reason="killed")
    log.write("launch_started", host="a", pid=2, across_hosts=False, version="x")  # started again
    records = event_log.read(str(tmp_path))
    assert [r["type"] for r in records] == ["launch_started", "host_ended", "launch_started"]
    newest = event_log.this_launch(records)
    assert [r["pid"] for r in newest] == [2] and event_log.of_type(newest, "host_ended") == []


def test_an_unknown_record_type_is_a_bug_named_at_once(tmp_path):
    with pytest.raises(ValueError, match="no record type 'rounds_started'"):
        event_log.EventLog(str(tmp_path)).write("rounds_started", round=1)


def test_the_schema_is_the_one_the_docs_describe():
    with open(os.path.join(REPO, "docs", "event-log.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(\w+)` \|([^|]*)\|", f.read(), re.MULTILINE)
    documented = {kind: set(re.findall(r"`(\w+)`", fields)) for kind, fields in rows}
    assert set(documented) == set(event_log.SCHEMA)
    for kind, fields in event_log.SCHEMA.items():
        assert set(fields) <= documented[kind], (kind, set(fields) - documented[kind])
