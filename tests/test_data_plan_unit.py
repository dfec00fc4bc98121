"""The job's data plan (heterps_paddle/data_plan/): the multiset of the trainers' offers, shards handed out as
trainers ask, a checkpoint inside a pass at a shard boundary, and both places it is kept (the coordinator's board, a
files board under a lock).  The rules of paces, empty files, bounds and pages: tests/test_data_plan_rules_unit.py."""

import json
import multiprocessing

import pytest

from heterps_paddle import rendezvous
from heterps_paddle.data_plan import DataPlan
from heterps_paddle.launch.board import Board


def ask(plan, **message):
    reply = plan.answer({"op": "shards", "pass": 1, **message})
    assert "error" not in reply, reply
    return reply


def offer(plan, number, trainer, files, trainers=2, done_before=()):
    message = {"do": "offer", "pass": number, "trainers": trainers, "trainer": trainer, "files": files}
    return ask(plan, **message, done_before=list(done_before))


def files(prefix, names):
    return [[name, f"/{prefix}/{name}"] for name in names]


def test_a_pass_starts_at_the_first_offer_and_ends_once_every_trainer_offered_with_the_multiset_of_offers():
    """A file two trainers offered is two shards (as plain Paddle trains a file two trainers were given twice)."""
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1", "f2"]))
    assert ask(plan, do="take", trainer=0, want=3) == {"shards": [["f1", "/a/f1"], ["f2", "/a/f2"]]}
    ask(plan, do="finish", trainer=0, shards=["f1", "f2"])
    assert "1 trainer(s) to offer their files" in ask(plan, do="take", trainer=0)["wait"]  # not its end yet
    # trainer 1 offers f2 (a copy: trained again, by whoever is free) and f3, under its own paths
    reply = offer(plan, 1, 1, files("b", ["f2", "f3"]))
    assert (reply["files"], reply["shards"], reply["shared_files"], reply["offered"]) == (3, 4, 1, 2)
    assert ask(plan, do="take", trainer=1) == {"shards": [["f2", "/b/f2"]]}
    assert ask(plan, do="take", trainer=0) == {"shards": [["f3", "/b/f3"]]}
    ask(plan, do="finish", trainer=0, shards=["f3"])
    assert ask(plan, do="take", trainer=0) == {"end": 1}
    ask(plan, do="finish", trainer=1, shards=["f2"])
    assert ask(plan, do="take", trainer=1) == {"end": 1}
    assert ask(plan, do="done")["done"] == ["f1", "f2", "f2", "f3"]


def test_a_fast_trainer_takes_more_and_each_shard_is_trained_once():
    plan = DataPlan()
    names = [f"f{k}" for k in range(10)]
    offer(plan, 1, 0, files("a", names[::2]))
    offer(plan, 1, 1, files("a", names[1::2]))
    slow = ask(plan, do="take", trainer=1)["shards"]
    trained = {0: [], 1: []}
    while True:
        reply = ask(plan, do="take", trainer=0)
        if "end" in reply:
            break
        for name, _ in reply["shards"]:
            ask(plan, do="finish", trainer=0, shards=[name])
            trained[0].append(name)
    ask(plan, do="finish", trainer=1, shards=[slow[0][0]])
    assert ask(plan, do="take", trainer=1) == {"end": 1}
    assert len(trained[0]) == 9 and sorted(trained[0] + [slow[0][0]]) == sorted(names)
    assert ask(plan, do="done", trainer=0)["done"] == sorted(names)


def test_a_resumed_pass_hands_out_only_the_shards_not_done():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1", "f2"]), trainers=1, done_before=["f1"])
    assert ask(plan, do="take", trainer=0, want=4) == {"shards": [["f2", "/a/f2"]]}
    ask(plan, do="finish", trainer=0, shards=["f2"])
    assert ask(plan, do="take", trainer=0) == {"end": 1}
    assert ask(plan, do="done", trainer=0)["done"] == ["f1", "f2"]


def test_a_shard_a_trainer_cannot_read_goes_to_another_and_none_that_can_is_an_error():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["x"]))
    offer(plan, 1, 1, files("b", ["y", "z"]))
    assert ask(plan, do="take", trainer=1) == {"shards": [["y", "/b/y"]]}  # its own files first
    assert ask(plan, do="take", trainer=0) == {"shards": [["x", "/a/x"]]}
    ask(plan, do="finish", trainer=0, shards=["x"])
    assert ask(plan, do="take", trainer=0) == {"shards": [["z", "/b/z"]]}
    ask(plan, do="give_back", trainer=0, shard="z", unreadable=True)
    assert ask(plan, do="take", trainer=0) == {"end": 1}  # z is trainer 1's to train
    ask(plan, do="finish", trainer=1, shards=["y"])
    assert ask(plan, do="take", trainer=1) == {"shards": [["z", "/b/z"]]}
    refused = plan.answer({"do": "give_back", "pass": 1, "trainer": 1, "shard": "z", "unreadable": True})
    assert "no trainer can read shard z (offered at /b/z)" in refused["error"]


def test_a_trainer_waits_while_another_holds_a_file_only_it_offered_that_may_come_back_unread():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["x1", "x2"]))
    offer(plan, 1, 1, files("b", ["y"]))
    ask(plan, do="finish", trainer=1, shards=[ask(plan, do="take", trainer=1)["shards"][0][0]])
    assert ask(plan, do="take", trainer=1) == {"shards": [["x1", "/a/x1"]]}  # another host's file
    assert ask(plan, do="take", trainer=0) == {"shards": [["x2", "/a/x2"]]}
    ask(plan, do="finish", trainer=0, shards=["x2"])
    assert "trainer 1 has this trainer's file x1" in ask(plan, do="take", trainer=0)["wait"]
    ask(plan, do="give_back", trainer=1, shard="x1", unreadable=True)  # not the same storage after all
    assert ask(plan, do="take", trainer=0) == {"shards": [["x1", "/a/x1"]]}
    ask(plan, do="finish", trainer=0, shards=["x1"])
    assert ask(plan, do="take", trainer=0) == {"end": 1} == ask(plan, do="take", trainer=1)


def test_a_checkpoint_inside_a_pass_comes_when_every_trainer_holds_no_shard():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1", "f2", "f3", "f4"]))
    offer(plan, 1, 1, files("a", ["f5", "f6"]))
    assert ask(plan, do="hold", trainer=0, ask="leave") == {
        "refused": "no shard taken since the pass began or its last checkpoint"
    }
    (a,) = ask(plan, do="take", trainer=0)["shards"]
    (b,) = ask(plan, do="take", trainer=1)["shards"]
    ask(plan, do="finish", trainer=0, shards=[a[0]])
    assert ask(plan, do="hold", trainer=0, ask="leave") == {"held": 2}  # one done, one in hand
    assert ask(plan, do="hold", trainer=1, ask="leave")["refused"] == "a checkpoint inside the pass is under way"
    assert ask(plan, do="take", trainer=0) == {"meet": 2, "shards_in_pass": 6}
    assert "wait" in ask(plan, do="take", trainer=0)  # told once; no shard until every trainer was told
    ask(plan, do="finish", trainer=1, shards=[b[0]])
    assert ask(plan, do="take", trainer=1) == {"meet": 2, "shards_in_pass": 6}
    assert ask(plan, do="done", trainer=0)["done"] == sorted([a[0], b[0]])
    assert "shards" in ask(plan, do="take", trainer=1)
    # the same ask is honoured once a pass
    assert ask(plan, do="hold", trainer=0, ask="leave") == {"refused": "honoured already"}


def test_no_checkpoint_inside_a_pass_a_trainer_ended():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1"]))
    offer(plan, 1, 1, files("a", ["f1", "f2", "f3"]))
    ask(plan, do="take", trainer=1, want=3)
    assert ask(plan, do="take", trainer=0) == {"shards": [["f1", "/a/f1"]]}  # f1's second copy
    ask(plan, do="finish", trainer=0, shards=["f1"])
    assert ask(plan, do="take", trainer=0) == {"end": 1}
    assert ask(plan, do="hold", trainer=1, ask="x")["refused"].startswith("a trainer ended the pass")


@pytest.mark.parametrize(
    "message, error",
    [
        ({"do": "take", "pass": 3, "trainer": 0}, "pass 3 was not offered"),
        ({"do": "take", "pass": 1, "trainer": 5}, "no trainer 5 among 2"),
        ({"do": "finish", "pass": 1, "trainer": 0, "shards": ["f9"]}, "does not hold shard 'f9'"),
        ({"do": "offer", "pass": 1, "trainer": 0, "trainers": 3, "files": []}, "has 2 trainers, not 3"),
        ({"do": "take", "pass": "x", "trainer": 0}, "malformed request"),
        ({"do": "fly", "pass": 1}, "unknown request 'fly'"),
        ({"pass": 1}, "malformed request"),
    ],
)
def test_bad_requests_are_refused_by_name(message, error):
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1"]))
    assert error in plan.answer(message)["error"]


def test_a_trainer_holding_shards_asks_for_none_and_old_passes_are_dropped():
    plan = DataPlan()
    for number in (1, 2, 3):
        for trainer in (0, 1):
            plan.answer({"do": "offer", "pass": number, "trainers": 2, "trainer": trainer, "files": files("a", ["f"])})
    assert sorted(plan.passes) == [2, 3]
    assert (
        "pass 1 is over" in plan.answer({"do": "offer", "pass": 1, "trainers": 2, "trainer": 0, "files": []})["error"]
    )
    ask(plan, do="take", **{"pass": 3}, trainer=0)
    assert "holding f" in plan.answer({"do": "take", "pass": 3, "trainer": 0})["error"]


def test_the_plan_survives_its_json():
    plan = DataPlan()
    offer(plan, 1, 0, files("a", ["f1", "f2"]))
    offer(plan, 1, 1, files("b", ["f2", "f3"]))
    ask(plan, do="take", trainer=1)
    again = DataPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again.to_json() == plan.to_json()
    assert "holding" in again.answer({"do": "take", "pass": 1, "trainer": 1})["error"]
    assert ask(again, do="take", trainer=0) == {"shards": [["f1", "/a/f1"]]}


def test_the_coordinators_board_answers_the_round_and_refuses_another_rounds_process():
    board = Board("127.0.0.2", launch="L1")
    reply = board.answer(
        {"op": "shards", "do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "files": [["n", "/p"]], "launch": "L1"}
    )
    assert reply["ok"] is True and reply["shards"] == 1
    refused = board.answer({"op": "shards", "do": "take", "pass": 1, "trainer": 0, "launch": "L0"})
    assert "another round" in refused["error"]
    assert board.answer({"op": "shards", "do": "take", "pass": 1, "trainer": 0, "launch": "L1"}) == {
        "shards": [["n", "/p"]]
    }


def _pull_all(directory, trainer, out):
    board = rendezvous.FileBoard(directory)
    names = [f"f{k:03d}" for k in range(60)]
    board.shards({"do": "offer", "pass": 1, "trainers": 2, "trainer": trainer, "files": files("d", names)})
    mine = []
    while True:
        reply = board.shards({"do": "take", "pass": 1, "trainer": trainer})
        if "end" in reply:
            break
        if "wait" in reply:
            continue
        for name, _ in reply["shards"]:
            board.shards({"do": "finish", "pass": 1, "trainer": trainer, "shards": [name]})
            mine.append(name)
    out.put(mine)


def test_a_files_board_hands_each_shard_to_one_of_two_processes(tmp_path):
    out = multiprocessing.get_context("fork").Queue()
    procs = [
        multiprocessing.get_context("fork").Process(target=_pull_all, args=(str(tmp_path), t, out)) for t in (0, 1)
    ]
    for p in procs:
        p.start()
    got = [out.get(timeout=120), out.get(timeout=120)]
    for p in procs:
        p.join(60)
    # each offered all 60: 120 shards, each name trained twice, by whoever was free
    assert sorted(got[0] + got[1]) == sorted([f"f{k:03d}" for k in range(60)] * 2)
    with pytest.raises(rendezvous.RendezvousError, match="pass 9 was not offered"):
        rendezvous.FileBoard(str(tmp_path)).shards({"do": "take", "pass": 9, "trainer": 0})


def test_a_slow_trainer_takes_no_shard_it_would_still_train_when_the_others_have_trained_all():
    """The straggler's tail: a trainer ten times slower than its peer (its last call's bytes a second) is handed
    a shard only while the peer would take longer than it to train what is left."""
    digest = "0" * 64
    names = [f"f{k:02d}:100:{digest}" for k in range(14)]
    plan = DataPlan()
    offer(plan, 1, 0, files("a", names))
    offer(plan, 1, 1, [])
    (fast,) = ask(plan, do="take", trainer=0, now=0.0)["shards"]
    (slow,) = ask(plan, do="take", trainer=1, now=0.0)["shards"]
    ask(plan, do="finish", trainer=0, shards=[fast[0]], now=1.0)  # 100 bytes/s
    ask(plan, do="finish", trainer=1, shards=[slow[0]], now=10.0)  # 10 bytes/s
    # 12 shards left: the fast one would take 12 s for them, the slow one 10 s for one: it takes one
    assert "shards" in ask(plan, do="take", trainer=1, now=10.0)
    for now in (11.0, 12.0, 13.0):  # the fast one trains three more
        ((name, _),) = ask(plan, do="take", trainer=0, now=now - 1.0)["shards"]
        ask(plan, do="finish", trainer=0, shards=[name], now=now)
    # now 8 left (the slow one's in hand too, for the fast one's count: 9 x 100 bytes / 100 a second = 9 s) ...
    assert plan.paces.rates == {0: 100.0, 1: 10.0}
    assert plan.passes[1].free_shards == 8
    # ... the slow one asking next (its shard in hand done) would need 10 s for one, the fast one 8 s for all: end
    held = list(plan.passes[1].held_by[1])
    ask(plan, do="finish", trainer=1, shards=held, now=20.0)
    assert ask(plan, do="take", trainer=1, now=20.0) == {"end": 1}
    taken = 0
    while "shards" in (reply := ask(plan, do="take", trainer=0, now=21.0)):
        ask(plan, do="finish", trainer=0, shards=[n for n, _ in reply["shards"]], now=21.5)
        taken += 1
    assert taken == 8 and len(ask(plan, do="done")["done"]) == 14


def test_each_trainers_pace_goes_on_into_the_next_pass():
    digest = "0" * 64
    plan = DataPlan()
    offer(plan, 1, 0, files("a", [f"f{k}:100:{digest}" for k in range(4)]))
    offer(plan, 1, 1, [])
    for trainer, seconds in ((0, 1.0), (1, 10.0)):
        ((name, _),) = ask(plan, do="take", trainer=trainer, now=0.0)["shards"]
        ask(plan, do="finish", trainer=trainer, shards=[name], now=seconds)
    offer(plan, 2, 0, files("a", [f"g{k}:100:{digest}" for k in range(3)]))
    offer(plan, 2, 1, [])
    assert plan.paces.rates == {0: 100.0, 1: 10.0}
    # the slow one's first shard of pass 2 would take it 10 s, the fast one 3 s for all: it takes none
    assert ask(plan, do="take", trainer=1, **{"pass": 2}) == {"end": 2}


def test_small_shards_are_handed_out_by_the_call_of_ten_seconds_but_the_tail_one_by_one():
    """Each call costs Paddle about 0.1 s: a trainer is handed shards for a call of CALL_S at its pace, while the
    shards left after it would keep every trainer busy longer than that; the pass's tail a shard at a time."""
    digest = "0" * 64
    names = [f"f{k:03d}:100:{digest}" for k in range(100)]  # a second each at 100 bytes a second
    plan = DataPlan()
    offer(plan, 1, 0, files("a", names))
    offer(plan, 1, 1, [])
    (first,) = ask(plan, do="take", trainer=0, now=0.0)["shards"]  # no pace known yet: one
    ask(plan, do="finish", trainer=0, shards=[first[0]], now=1.0)
    (second,) = ask(plan, do="take", trainer=1, now=0.0)["shards"]
    ask(plan, do="finish", trainer=1, shards=[second[0]], now=1.0)
    calls = []
    while True:
        reply = ask(plan, do="take", trainer=0, now=10.0)
        if "shards" not in reply:
            break
        calls.append(len(reply["shards"]))
        ask(plan, do="finish", trainer=0, shards=[n for n, _ in reply["shards"]], now=10.0 + len(reply["shards"]))
    assert calls[0] == 10 and calls[-1] == 1 and sum(calls) == 98, calls


def test_the_coordinators_board_hands_each_shard_to_one_of_many_threads():
    """The coordinator answers each connection in a thread of its own: every shard is handed out once."""
    import threading

    board = Board("127.0.0.2", launch="L")
    names = [f"f{k:04d}" for k in range(400)]
    for trainer in range(8):
        got = board.answer(
            {"op": "shards", "do": "offer", "pass": 1, "trainers": 8, "trainer": trainer, "files": files("a", names)}
        )
        assert "error" not in got, got
    taken = {t: [] for t in range(8)}

    def pull(trainer):
        while True:
            reply = board.answer({"op": "shards", "do": "take", "pass": 1, "trainer": trainer})
            if "shards" not in reply:
                return
            shard = [n for n, _ in reply["shards"]]
            taken[trainer] += shard
            board.answer({"op": "shards", "do": "finish", "pass": 1, "trainer": trainer, "shards": shard})

    threads = [threading.Thread(target=pull, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    everything = [n for shards in taken.values() for n in shards]
    assert sorted(everything) == sorted(names * 8)  # every trainer offered every file: 8 copies of each


def test_a_checkpoint_inside_a_resumed_pass_counts_only_this_rounds_shards_and_follows_the_one_resumed_from():
    plan = DataPlan()
    # resumed from pass-000000.3of6 with 3 shards done, of which only "a" is among this round's files
    message = {"do": "offer", "pass": 1, "trainers": 1, "trainer": 0, "files": files("h", ["a", "b", "c"])}
    ask(plan, **message, done_before=["a", "gone1", "gone2"], held_before=3)
    ask(plan, do="take", trainer=0)  # b
    assert ask(plan, do="hold", trainer=0, ask="x") == {
        "refused": "no shard taken since the pass began or its last checkpoint"
    }
    ask(plan, do="finish", trainer=0, shards=["b"])
    ask(plan, do="take", trainer=0)  # c, in hand: a, b done or in hand, yet no more than the 3 resumed from
    assert "refused" in ask(plan, do="hold", trainer=0, ask="x")
    plan2 = DataPlan()
    ask(plan2, **message, done_before=["a", "gone1", "gone2"], held_before=0)
    ask(plan2, do="take", trainer=0)
    assert ask(plan2, do="hold", trainer=0, ask="x") == {"held": 2}  # "a" and "b", of the pass's 3: 0 < K < S


def test_a_call_is_no_larger_for_the_scripts_progress_lines():
    """``least`` (an earlier version's least bytes of a call, the script's print_period of batches) is accepted and
    not used: a trainer whose pace is unknown takes one shard a reader thread."""
    digest = "0" * 64
    plan = DataPlan()
    offer(plan, 1, 0, files("a", [f"f{k}:100:{digest}" for k in range(5)]), trainers=1)
    assert len(ask(plan, do="take", trainer=0, least=250)["shards"]) == 1
