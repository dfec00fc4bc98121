"""The data plan's rules of issue 60 (heterps_paddle/data_plan/): the pass is the multiset of the offers, a pace is
never guessed nor lost, empty files are skipped, every fault is an answer, every request is bounded, offers and the
done list come in pages, and the state survives its JSON request by request."""

import collections
import json
import os
import random

import pytest

from heterps_paddle.data_plan import DataPlan, bounds, shards

DIGEST = "0" * 64


def name(base, size):
    return f"{base}:{size}:s-{DIGEST}"


def ask(plan, **message):
    reply = plan.answer({"op": "shards", "pass": 1, **message})
    assert "error" not in reply, reply
    return reply


def offer(plan, trainer, names, trainers=2, number=1, **extra):
    files = [[n, f"/h{trainer}/{n.split(':')[0]}"] for n in names]
    return ask(plan, do="offer", trainers=trainers, trainer=trainer, files=files, **{"pass": number}, **extra)


def pull_all(plan, trainers, number=1):
    """Every trainer takes and finishes until each is told its pass ended; the names each trained."""
    trained = {t: [] for t in range(trainers)}
    ended = set()
    while len(ended) < trainers:
        for t in range(trainers):
            if t in ended:
                continue
            reply = ask(plan, do="take", trainer=t, **{"pass": number})
            if "end" in reply:
                ended.add(t)
            elif "shards" in reply:
                got = [n for n, _ in reply["shards"]]
                ask(plan, do="finish", trainer=t, shards=got, **{"pass": number})
                trained[t] += got
    return trained


def test_a_file_every_trainer_was_given_is_trained_by_as_many_and_a_resume_counts_its_copies():
    plan = DataPlan()
    for t in range(3):
        reply = offer(plan, t, ["f1", "f2"], trainers=3)
    assert (reply["files"], reply["shards"], reply["shared_files"], reply["offered"]) == (2, 6, 2, 3)
    trained = pull_all(plan, 3)
    assert sorted(sum(trained.values(), [])) == ["f1"] * 3 + ["f2"] * 3
    assert ask(plan, do="done")["done"] == ["f1"] * 3 + ["f2"] * 3
    # a resume whose checkpoint holds two copies of f1: one copy of f1 left, three of f2
    again = DataPlan()
    for t in range(3):  # every trainer says the same done list: counted once, not three times
        offer(again, t, ["f1", "f2"], trainers=3, done_before=["f1", "f1"])
    assert sorted(sum(pull_all(again, 3).values(), [])) == ["f1"] + ["f2"] * 3
    assert ask(again, do="done")["done"] == ["f1"] * 3 + ["f2"] * 3


def test_a_file_listed_twice_by_one_trainer_is_two_shards_handed_out_to_two_calls():
    plan = DataPlan()
    offer(plan, 0, ["f1", "f1", "f2"], trainers=1)
    first = ask(plan, do="take", trainer=0, want=4)["shards"]
    assert [n for n, _ in first] == ["f1", "f2"]  # one copy of a name a call
    ask(plan, do="finish", trainer=0, shards=["f1", "f2"])
    assert [n for n, _ in ask(plan, do="take", trainer=0, want=4)["shards"]] == ["f1"]


def test_empty_files_are_skipped_and_counted():
    plan = DataPlan()
    reply = offer(plan, 0, [name("empty-1", 0), name("a", 10), name("empty-2", 0)])
    assert (reply["files"], reply["shards"], reply["empty_files"]) == (1, 1, 2)
    reply = offer(plan, 1, [name("empty-1", 0)])  # the same empty file again: still two empty files
    assert (reply["shards"], reply["empty_files"]) == (1, 2)
    assert sum(pull_all(plan, 2).values(), []) == [name("a", 10)]
    # a pass of empty files only ends at once
    offer(plan, 0, [name("empty-1", 0)], number=2)
    offer(plan, 1, [], number=2)
    assert ask(plan, do="take", trainer=1, **{"pass": 2}) == {"end": 2}


def test_an_unknown_pace_takes_one_shard_a_reader_thread_however_large_the_pass():
    plan = DataPlan()
    offer(plan, 0, [name(f"f{k}", 100) for k in range(1000)])
    offer(plan, 1, [])
    assert len(ask(plan, do="take", trainer=0, want=3, now=0.0)["shards"]) == 3
    # trainer 0's pace is known, trainer 1's not: the call is still one a reader thread (no guess at the share)
    ask(plan, do="finish", trainer=0, shards=list(plan.passes[1].held_by[0]), now=1.0)
    assert len(ask(plan, do="take", trainer=0, want=3, now=1.0)["shards"]) == 3


def test_no_trainer_takes_half_of_a_small_pass():
    """The issue's pass of eight shards: with paces unknown, or known, a call is one shard a reader thread (the
    pass's tail is all of it), never four."""
    plan = DataPlan()
    names = [name(f"f{k}", 1000) for k in range(8)]
    offer(plan, 0, names[:4])
    offer(plan, 1, names[4:])
    for t in (0, 1):
        (shard,) = ask(plan, do="take", trainer=t, now=0.0)["shards"]
        ask(plan, do="finish", trainer=t, shards=[shard[0]], now=1.0)
    assert plan.paces.rates == {0: 1000.0, 1: 1000.0}
    assert len(ask(plan, do="take", trainer=0, now=1.0)["shards"]) == 1


def test_a_pace_is_kept_from_pass_to_pass_even_measured_after_the_next_pass_began():
    """The issue's loss: pass 2 was made while the slow trainer still trained its pass 1 call; its pace, measured
    then, goes into pass 2, and a pass it trains nothing in does not reset it."""
    plan = DataPlan()
    offer(plan, 0, [name("f0", 100)])
    offer(plan, 1, [name("f1", 100)])
    (fast,) = ask(plan, do="take", trainer=0, now=0.0)["shards"]
    (slow,) = ask(plan, do="take", trainer=1, now=0.0)["shards"]
    ask(plan, do="finish", trainer=0, shards=[fast[0]], now=1.0)
    assert ask(plan, do="take", trainer=0, now=1.0) == {"end": 1}
    offer(plan, 0, [name(f"g{k}", 100) for k in range(3)], number=2)  # pass 2 begins ...
    ask(plan, do="finish", trainer=1, shards=[slow[0]], now=10.0)  # ... then the slow one's pace is measured
    offer(plan, 1, [], number=2)
    assert plan.paces.rates == {0: 100.0, 1: 10.0}
    # pass 2: 10 s for one shard against the fast one's 3 s for all: it trains none, and keeps its pace
    assert ask(plan, do="take", trainer=1, **{"pass": 2}, now=10.0) == {"end": 2}
    pull_all(plan, 2, number=2)
    offer(plan, 0, [name(f"h{k}", 100) for k in range(3)], number=3)
    offer(plan, 1, [], number=3)
    assert plan.paces.rates[1] == 10.0 and plan.passes[3].active_unknown == 0


def test_progress_measures_a_pace_while_a_call_runs_and_a_call_that_measured_nothing_leaves_it():
    plan = DataPlan()
    offer(plan, 0, [name(f"f{k}", 1000) for k in range(4)], trainers=1)
    (shard,) = ask(plan, do="take", trainer=0, now=0.0)["shards"]
    ask(plan, do="progress", trainer=0, bytes=0, now=2.0)  # nothing trained yet: no pace, not a pace of 0
    assert plan.paces.get(0) is None
    ask(plan, do="progress", trainer=0, bytes=500, now=5.0)
    assert plan.paces.get(0) == 100.0
    refused = plan.answer({"do": "progress", "pass": 1, "trainer": 0, "bytes": 5000, "now": 6.0})
    assert "reports 5000 bytes trained of the 1000 it holds" in refused["error"]
    ask(plan, do="finish", trainer=0, shards=[shard[0]], now=5.0 + 5.0)
    assert plan.paces.get(0) == 100.0
    (shard,) = ask(plan, do="take", trainer=0, now=20.0)["shards"]
    ask(plan, do="finish", trainer=0, shards=[shard[0]], now=20.0)  # no time measured: the pace stays
    assert plan.paces.get(0) == 100.0
    refused = plan.answer({"do": "progress", "pass": 1, "trainer": 0, "bytes": 1, "now": 21.0})
    assert "reports progress holding no shard" in refused["error"]


def test_every_fault_of_the_plan_is_an_answer_naming_the_pass_trainer_and_request(monkeypatch):
    plan = DataPlan()
    offer(plan, 0, ["f1"])

    def broken(self, trainer, want, now):
        return 1 / 0

    monkeypatch.setattr(shards.PassShards, "take", broken)
    error = plan.answer({"do": "take", "pass": 1, "trainer": 0})["error"]
    assert "pass 1, trainer 0, do 'take'" in error and "ZeroDivisionError" in error
    assert "not an object" in DataPlan().answer(["take"])["error"]


@pytest.mark.parametrize(
    "message, error",
    [
        ({"do": "offer", "pass": 1, "trainers": 100_001, "trainer": 0, "files": []}, "'trainers' is 100001, outside"),
        ({"do": "offer", "pass": 3, "trainers": 2, "trainer": 0, "files": []}, "pass 3 offered while the newest is 1"),
        ({"do": "offer", "pass": 2, "trainers": 2, "trainer": 0, "files": []}, "before every trainer offered pass 1"),
        ({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": [["x" * 5000, "/p"]]}, "over 4096"),
        ({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": "f"}, "files offered is not a list"),
        ({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": [["a"]]}, "not a [name, path] pair"),
        ({"do": "take", "pass": 1, "trainer": 0, "want": 5000}, "'want' is 5000, outside [1, 1024]"),
        ({"do": "take", "pass": True, "trainer": 0}, "'pass' is True, not an integer"),
        ({"do": "take", "pass": 1, "trainer": 0, "now": float("nan")}, "not a finite number"),
        ({"do": "progress", "pass": 1, "trainer": 0, "bytes": -1}, "'bytes' is -1, outside"),
        ({"do": "give_back", "pass": 1, "trainer": 0, "shard": "f1", "unreadable": "yes"}, "not a boolean"),
        ({"do": "done", "pass": 1, "from": 99}, "'from' is 99, outside [0, 0]"),
        ({"do": "hold", "pass": 1, "ask": "a" * 2000}, "over 1024"),
    ],
)
def test_every_count_size_and_pass_number_is_bounded_and_named(message, error):
    plan = DataPlan()
    offer(plan, 0, ["f1"])
    assert error in plan.answer(message)["error"]


def test_shards_over_the_bound_are_refused(monkeypatch):
    monkeypatch.setattr(shards, "MAX_SHARDS", 3)
    plan = DataPlan()
    offer(plan, 0, ["a", "a"])
    refused = plan.answer({"do": "offer", "pass": 1, "trainers": 2, "trainer": 1, "files": [["a", "/a"], ["b", "/b"]]})
    assert "pass 1: over 3 shards" in refused["error"]


def test_an_offer_in_pages_hands_out_from_its_first_page_and_opens_the_pass_with_its_last():
    plan = DataPlan()
    page = {"do": "offer", "trainers": 2, "trainer": 0, "pages": 2}
    reply = ask(plan, **page, page=0, files=[["a", "/a"]], done_before=["b"])
    assert (reply["shards"], reply["offered"]) == (1, 0)
    assert ask(plan, **page, page=0, files=[["a", "/a"]], done_before=["b"])["page"] == 0  # sent again: the same
    refused = plan.answer({**page, "pass": 1, "page": 0, "files": [["z", "/z"]]})
    assert "offered other files a second time" in refused["error"]
    assert "pages, then in 2" in plan.answer({**page, "pass": 1, "pages": 3, "page": 2, "files": []})["error"]
    assert ask(plan, do="take", trainer=0) == {"shards": [["a", "/a"]]}
    assert "wait" in ask(plan, do="take", trainer=1)
    ask(plan, do="offer", trainers=2, trainer=1, files=[])
    assert "wait" in ask(plan, do="take", trainer=1)  # trainer 0's offer is not complete
    # its second page: b, done before (said on its first page), is no shard to hand out; c is
    reply = ask(plan, **page, page=1, files=[["b", "/b"], ["c", "/c"]])
    assert (reply["shards"], reply["offered"]) == (3, 2)
    assert ask(plan, do="take", trainer=1) == {"shards": [["c", "/c"]]}


def test_an_offer_page_out_of_order_is_refused():
    plan = DataPlan()
    refused = plan.answer({"do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "pages": 3, "page": 1, "files": []})
    assert "offered page 1 before page 0" in refused["error"]


def test_the_done_list_comes_in_pages_within_the_line_limit(monkeypatch):
    monkeypatch.setattr(bounds, "DONE_PAGE_BYTES", 40)
    plan = DataPlan()
    names = [f"file-{k:03d}" for k in range(10)]
    offer(plan, 0, names, trainers=1, done_before=names[:3])
    pull_all(plan, 1)
    whole = ask(plan, do="done")
    pages, at = [], 0
    while at is not None:
        page = ask(plan, do="done", **{"from": at})
        assert page["total"] == 10 and (len(page["done"]) == 1 or sum(len(n) + 4 for n in page["done"]) <= 40)
        pages.append(page["done"])
        at = page["next"]
    assert len(pages) > 3 and sum(pages, []) == whole["done"] == names  # 3 done before, 7 now


def _random_requests(seed, trainers=4, steps=400):
    """A random sequence of plausible requests (some refused) over two passes."""
    rng = random.Random(seed)
    names = [name(f"f{k}", rng.choice([0, 10, 100, 1000])) for k in range(30)]
    out = []
    now = 0.0
    for number in (1, 2):
        for t in range(trainers):
            mine = rng.sample(names, 8) + ([names[0]] if t % 2 else [])
            out.append({"do": "offer", "pass": number, "trainers": trainers, "trainer": t, "now": now,
                        "files": [[n, f"/h{t}/{n[:3]}"] for n in mine]})  # fmt: skip
        for _ in range(steps // 2):
            now += rng.random()
            t = rng.randrange(trainers)
            do = rng.choice(["take", "take", "finish", "progress", "give_back", "hold", "done"])
            out.append({"do": do, "pass": number, "trainer": t, "now": now, "want": rng.randint(1, 3),
                        "ask": f"ask {rng.randrange(3)}", "bytes": rng.randrange(200)})  # fmt: skip
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_rebuilt_from_its_json_before_every_request_answers_as_the_plan_kept_in_memory(seed):
    """A files board reads the plan from its file for every request: rebuilt, it answers exactly alike (its running
    totals, heaps and free names rebuilt from the counts)."""
    kept, held = DataPlan(), {}
    rebuilt_state = DataPlan().to_json()
    for message in _random_requests(seed):
        t = message.get("trainer")
        if message["do"] == "finish":
            message["shards"] = held.get(t, [])
        if message["do"] == "give_back":
            message["shard"], message["unreadable"] = (held.get(t) or ["none"])[0], True
        rebuilt = DataPlan.from_json(json.loads(json.dumps(rebuilt_state)))
        reply = kept.answer(message)
        assert rebuilt.answer(message) == reply, message
        assert rebuilt.to_json() == kept.to_json()
        rebuilt_state = rebuilt.to_json()
        if "shards" in reply and message["do"] == "take":
            held[t] = [n for n, _ in reply["shards"]]
        elif message["do"] in ("finish", "give_back") and "error" not in reply:
            held[t] = [] if message["do"] == "finish" else held[t][1:]


def test_many_shards_and_trainers_are_each_trained_as_often_as_offered():
    rng = random.Random(5)
    trainers, files = 200, 5000
    plan = DataPlan()
    counts = {}
    for t in range(trainers):
        mine = [f"p{k:05d}" for k in range(t, files, trainers)] + [f"p{rng.randrange(files):05d}" for _ in range(3)]
        for n in mine:
            counts[n] = counts.get(n, 0) + 1
        offer(plan, t, mine, trainers=trainers)
    trained = sum(pull_all(plan, trainers).values(), [])
    assert collections.Counter(trained) == counts


def test_plan_files_answer_as_one_plan_across_processes_and_compact(tmp_path, monkeypatch):
    """Two processes' views of a plan kept in files (journal.py: a snapshot and a journal of requests), each
    replaying the other's lines: they answer as one plan in memory, through compactions to a new snapshot."""
    from heterps_paddle.data_plan import journal

    monkeypatch.setattr(journal, "COMPACT_BYTES", 2000)
    views = [journal.PlanFiles(str(tmp_path)), journal.PlanFiles(str(tmp_path))]
    kept, held = DataPlan(), {}
    generations = set()
    for k, message in enumerate(_random_requests(11)):
        t = message.get("trainer")
        if message["do"] == "finish":
            message["shards"] = held.get(t, [])
        if message["do"] == "give_back":
            message["shard"], message["unreadable"] = (held.get(t) or ["none"])[0], False
        reply = views[k % 2].answer(message)
        assert reply == kept.answer(message), message
        generations.add(views[k % 2].generation)
        if "shards" in reply and message["do"] == "take":
            held[t] = [n for n, _ in reply["shards"]]
        elif message["do"] in ("finish", "give_back") and "error" not in reply:
            held[t] = [] if message["do"] == "finish" else held[t][1:]
    assert len(generations) > 2  # compacted, and each view followed
    fresh = journal.PlanFiles(str(tmp_path))
    assert fresh.answer({"do": "done", "pass": 2}) == kept.answer({"do": "done", "pass": 2})
    assert set(os.listdir(tmp_path)) == {"data-plan.json", f"data-plan.{fresh.generation}.requests"}


def test_plan_files_cut_a_half_written_request_keep_no_refused_one_and_start_anew_when_removed(tmp_path):
    """A journal line a killed process left half-written was never answered: the next reader cuts it off and
    answers as the plan without it.  A request refused (by the board's check or by the plan) is not journaled.
    The files removed (a kept board's new round), a process's view starts from an empty plan."""
    from heterps_paddle.data_plan import journal

    directory = str(tmp_path / "data-plan")
    writer, reader, kept = journal.PlanFiles(directory), journal.PlanFiles(directory), DataPlan()
    offer_message = {"do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "now": 0}
    offer_message["files"] = [[name(base, 100), f"/d/{base}"] for base in ("a", "b")]
    assert writer.answer(offer_message) == kept.answer(offer_message)
    with open(writer.journal(), "ab") as f:
        f.write(b'{"do": "take", "pass": 1, "tra')  # a writer killed inside its append
    take = {"do": "take", "pass": 1, "trainer": 0, "want": 1, "now": 1}
    assert reader.answer(take) == kept.answer(take)
    assert open(reader.journal(), "rb").read().endswith(b"\n")
    assert writer.answer({"do": "take", "pass": 1, "trainer": 0, "want": 1, "now": 2}) == kept.answer(
        {**take, "now": 2}
    )
    size = os.path.getsize(writer.journal())
    refused = writer.answer({"do": "take", "pass": 1, "trainer": 0}, lambda plan: "not from this round")
    assert refused == {"error": "not from this round"}
    assert "error" in writer.answer({"do": "take", "pass": 7, "trainer": 0})  # the plan's own refusal
    assert os.path.getsize(writer.journal()) == size
    journal.remove(directory)
    assert "error" in reader.answer({"do": "take", "pass": 1, "trainer": 0})  # pass 1 no longer offered


def test_the_scale_bench_drives_every_simulated_trainer_to_each_pass_end_within_the_line_limit():
    import argparse

    from heterps_paddle.control import MAX_LINE
    from heterps_paddle.tools.bench import data, data_scale

    parser = argparse.ArgumentParser()
    data.add_arguments(parser)
    assert parser.parse_args(["--scale", "--json"]).scale is True
    report = data_scale.simulate(300, 7)
    assert [p["ended"] for p in report["passes"]] == [7, 7]
    assert report["longest_line"] < MAX_LINE and report["requests"]["take"] >= 300 // data_scale.WANT
    assert report["files_board"]["journal"]["request_p50_ms"] > 0


def test_a_file_larger_than_a_range_is_cut_into_ranges_where_the_trainers_read_them_and_resumed_by_range():
    from heterps_paddle.data_plan import names as content

    big, small = name("day-1", 2 << 30), name("day-2", 1000)  # 2 GiB: eight ranges of 256 MiB
    plan = DataPlan()
    reply = offer(plan, 0, [big, small], trainers=1, ranges=True)
    assert (reply["files"], reply["shards"]) == (2, 9)
    trained = pull_all(plan, 1)[0]
    pieces = [content.parse(n) for n in trained if n != small]
    assert [(p.start, p.end) for p in pieces] == [(k << 28, (k + 1) << 28) for k in range(8)]
    assert all(p.file == big and content.size_of(str(p)) == 1 << 28 for p in pieces)
    # a resume goes by ranges: those done before are not handed out again
    again = DataPlan()
    offer(again, 0, [big, small], trainers=1, ranges=True, done_before=trained[:5])
    assert sorted(pull_all(again, 1)[0]) == sorted(trained[5:])
    # where the trainers do not read ranges (the runtime says so), a file is one shard
    whole = DataPlan()
    assert offer(whole, 0, [big], trainers=1)["shards"] == 1


def test_range_names_parse_within_their_file_only():
    from heterps_paddle.data_plan import names as content

    file = name("f", 100)
    assert content.parse(f"{file}@10-60") == ("f", 100, f"s-{DIGEST}", 10, 60)
    assert content.size_of(f"{file}@10-60") == 50 and content.size_of(file) == 100
    for bad in (f"{file}@60-10", f"{file}@0-101", f"{file}@5-5"):
        assert content.parse(bad) is None
    assert content.ranges(file, 40) == [f"{file}@0-40", f"{file}@40-80", f"{file}@80-100"]
    assert content.ranges(file, 100) == [file] and content.ranges("/a/path", 1) == ["/a/path"]


def test_names_said_done_and_empty_files_are_bounded_too(monkeypatch):
    monkeypatch.setattr(shards, "MAX_SHARDS", 2)
    plan = DataPlan()
    refused = plan.answer({"do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "done_before": ["a", "b", "c"]})
    assert "over 2 names" in refused["error"]
    empty = [[name(f"e{k}", 0), f"/e{k}"] for k in range(3)]
    refused = DataPlan().answer({"do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "files": empty})
    assert "over 2 empty files" in refused["error"]


def test_a_file_every_one_of_many_trainers_offered_is_handed_out_as_often_without_a_push_to_each_ones_heap():
    """Each trainer offers the file after the others took every copy so far: each copy comes free with its offer,
    and goes on the offering trainer's own heap only, past a few offerers (else a thousand pushes a copy)."""
    trainers = 3 * shards.QUEUED_OFFERERS
    plan = DataPlan()
    for t in range(trainers):
        offer(plan, t, ["f", f"own-{t}"], trainers=trainers)
        assert ask(plan, do="take", trainer=t, want=2)["shards"] == [["f", f"/h{t}/f"], [f"own-{t}", f"/h{t}/own-{t}"]]
    assert max(len(heap) for heap in plan.passes[1]._own.values()) <= shards.QUEUED_OFFERERS + 2
    for t in range(trainers):
        ask(plan, do="finish", trainer=t, shards=["f", f"own-{t}"])
    assert ask(plan, do="done")["done"].count("f") == trainers
