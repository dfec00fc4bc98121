"""A small CTR-DNN fleet job for the sections runtime: what the tests and ``heterps bench sections`` launch.

    python -m paddle.distributed.launch $(heterps launch-args PLAN.json) --log_dir LOG \\
        heterps_paddle/sections/ctr_job.py --data DIR --plan PLAN.json --out result.json

Without ``--plan`` it is the same model as plain async PS (the unsplit reference).  ``gen`` writes the
generated data (slot-format text for a QueueDataset and a held-out .npz):

    python heterps_paddle/sections/ctr_job.py gen --out DIR --rows 20000 --seed 1

Model (CTR-DNN as in PaddleRec, scaled down): SLOTS sparse slots sharing one table (layer ``emb``: lookup
+ sum pooling + concat with the dense features), fc layers ``fc_0``.. with relu, a 2-way softmax
layer with the loss and AUC.  Worker 0 evaluates held-out AUC from the servers' parameters at the end
and writes it with the last stage's logged loss curve to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SLOTS = 8
VOCAB = 1000  # ids per slot; slot s uses ids [s * VOCAB, (s + 1) * VOCAB)
DENSE = 4
EMB_DIM = 8
HIDDEN = (32, 32)


def gen(out: str, rows: int, heldout: int, seed: int, files: int = 2) -> None:
    """Zipf-ish ids with a planted logistic signal; best possible AUC is well below 1."""
    rng = np.random.default_rng(seed)
    w_slot = rng.normal(0, 0.8, size=(SLOTS, VOCAB))
    w_dense = rng.normal(0, 0.5, size=DENSE)
    total = rows + heldout
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.05
    p /= p.sum()
    ids = rng.choice(VOCAB, size=(total, SLOTS), p=p)
    dense = rng.random((total, DENSE)).astype(np.float32)
    logit = w_slot[np.arange(SLOTS), ids].sum(1) + (dense - 0.5) @ w_dense * 2 - 0.3
    label = (rng.random(total) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    gids = ids + np.arange(SLOTS) * VOCAB
    os.makedirs(out, exist_ok=True)
    per = (rows + files - 1) // files
    for f in range(files):
        with open(os.path.join(out, f"part-{f}.txt"), "w") as fh:
            for r in range(f * per, min(rows, (f + 1) * per)):
                parts = [f"1 {label[r]}", f"{DENSE} " + " ".join(f"{x:.5f}" for x in dense[r])]
                parts += [f"1 {g}" for g in gids[r]]
                fh.write(" ".join(parts) + "\n")
    np.savez(os.path.join(out, "heldout.npz"), ids=gids[rows:], dense=dense[rows:], label=label[rows:])


def build_model(lr: float):
    import paddle

    label = paddle.static.data("label", [None, 1], "int64")
    dense = paddle.static.data("dense_input", [None, DENSE], "float32")
    slots = [paddle.static.data(f"s{i}", [None, 1], "int64", lod_level=1) for i in range(SLOTS)]
    pooled = []
    for s in slots:
        emb = paddle.static.nn.sparse_embedding(
            input=s, size=[SLOTS * VOCAB, EMB_DIM],
            param_attr=paddle.ParamAttr(name="emb.w_0",
                                        initializer=paddle.nn.initializer.Uniform(-0.05, 0.05)))
        emb = paddle.reshape(emb, [-1, EMB_DIM])
        pooled.append(paddle.static.nn.sequence_lod.sequence_pool(emb, "sum"))
    x = paddle.concat(pooled + [dense], axis=1)
    for h in HIDDEN:
        x = paddle.static.nn.fc(x, h, activation="relu")
    predict = paddle.static.nn.fc(x, 2, activation="softmax")
    cost = paddle.nn.functional.cross_entropy(predict, label, use_softmax=False, reduction="none")
    loss = paddle.mean(cost)
    auc_var, _, _ = paddle.static.auc(input=predict, label=label)
    return [label, dense] + slots, predict, loss, auc_var


def train(args) -> int:
    import paddle
    import paddle.distributed.fleet as fleet

    import heterps_paddle  # noqa: F401  (installs strategy.heterps)
    from heterps_paddle.sections import runtime

    fault = os.environ.get("HETERPS_JOB_FAULT", "")  # fault injection for the tests (docs/sections.md)
    if fault == "heter_never_starts" and runtime.role() == "heter":
        print("heterps-job: injected fault: this heterogeneous trainer exits before starting", flush=True)
        os._exit(1)

    paddle.enable_static()
    paddle.seed(args.seed)
    np.random.seed(args.seed)
    fleet.init()
    main, startup = paddle.static.default_main_program(), paddle.static.default_startup_program()
    main.random_seed = startup.random_seed = args.seed
    feeds, predict, loss, auc_var = build_model(args.lr)
    test_program = main.clone(for_test=True)
    test_startup = startup.clone()

    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    if args.plan:
        strategy.heterps = True
        strategy.heterps_configs = {"plan": args.plan}
        strategy.pipeline_configs = {"accumulate_steps": args.microbatches}
    opt = fleet.distributed_optimizer(paddle.optimizer.Adam(args.lr), strategy)
    opt.minimize(loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    program = paddle.static.default_main_program()
    print_period = args.print_period
    # The loss lives in the last stage's section, inside its heter block (not block 0).
    fetch = [blk.vars[v.name] for v in (loss, auc_var) for blk in program.blocks if v.name in blk.vars][:2]
    if runtime.role() == "heter":
        dataset = runtime.heter_worker_dataset(program)
    else:
        dataset = paddle.distributed.QueueDataset()
        dataset.init(batch_size=args.batch, thread_num=1, use_var=feeds, pipe_command="cat")
        files = sorted(os.path.join(args.data, f) for f in os.listdir(args.data) if f.endswith(".txt"))
        mine = files[fleet.worker_index()::fleet.worker_num()] * args.epochs
        dataset.set_filelist(mine)
    if fault.startswith("heter_dies_after=") and runtime.role() == "heter":
        import threading

        delay = float(fault.split("=", 1)[1])

        def die():
            time.sleep(delay)
            print(f"heterps-job: injected fault: heterogeneous trainer pid {os.getpid()} dies now", flush=True)
            os._exit(1)

        threading.Thread(target=die, daemon=True).start()
    t0 = time.time()
    exe.train_from_dataset(program, dataset, fetch_list=fetch, fetch_info=[v.name.split(".")[0] for v in fetch]
                           if fetch else None, print_period=print_period, debug=False)
    elapsed = time.time() - t0
    print(f"heterps-job: role={runtime.role()} stage={runtime.stage_id()} train_start={t0:.3f} "
          f"train_seconds={elapsed:.3f}", flush=True)

    result = {"role": runtime.role(), "stage": runtime.stage_id(), "train_seconds": elapsed}
    if runtime.role() == "trainer" and fleet.worker_index() == 0:
        rt = fleet.fleet._runtime_handle
        eval_scope = paddle.static.Scope()
        eval_prog = runtime.distributed_eval_program(test_program, rt)
        with paddle.static.scope_guard(eval_scope):
            exe.run(test_startup)
        pulled = runtime.pull_dense_into(eval_scope, rt)
        held = np.load(os.path.join(args.data, "heldout.npz"))
        scores = []
        place = paddle.CPUPlace()
        n = len(held["label"])
        for b in range(0, n, 512):
            ids = held["ids"][b:b + 512]
            m = len(ids)
            feed = {"dense_input": held["dense"][b:b + 512], "label": held["label"][b:b + 512].reshape(-1, 1)}
            for i in range(SLOTS):
                feed[f"s{i}"] = paddle.base.create_lod_tensor(ids[:, i:i + 1].astype("int64"), [[1] * m], place)
            out = exe.run(eval_prog, feed=feed, fetch_list=[predict.name], scope=eval_scope)[0]
            scores.append(np.asarray(out)[:, 1])
        result["heldout_auc"] = runtime.auc(held["label"], np.concatenate(scores))
        result["dense_vars_pulled"] = len(pulled)
        result["samples"] = int(sum(1 for f in files for _ in open(f)) * args.epochs)
        print(f"heterps-job: heldout_auc={result['heldout_auc']:.5f}", flush=True)
    if args.out:
        suffix = f".{runtime.role()}{runtime.stage_id()}.{os.environ.get('PADDLE_TRAINER_ID', '0')}" \
            if runtime.role() == "heter" else f".{runtime.role()}{fleet.worker_index()}"
        with open(args.out + suffix, "w") as f:
            json.dump(result, f)
    fleet.stop_worker()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "gen":
        p = argparse.ArgumentParser(prog="ctr_job gen")
        p.add_argument("--out", required=True)
        p.add_argument("--rows", type=int, default=20000)
        p.add_argument("--heldout", type=int, default=4000)
        p.add_argument("--seed", type=int, default=1)
        a = p.parse_args(argv[1:])
        gen(a.out, a.rows, a.heldout, a.seed)
        return 0
    p = argparse.ArgumentParser(prog="ctr_job")
    p.add_argument("--data", required=True)
    p.add_argument("--plan", default=None)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--print_period", type=int, default=20)
    p.add_argument("--out", default=None)
    return train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
