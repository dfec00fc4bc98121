"""CTR-DNN as a sectioned fleet job: what the sections tests and ``heterps bench sections`` launch.

    python -m heterps_paddle.tools.section_launch --plan PLAN.json --log_dir LOG -- \
        heterps_paddle/tools/ctr_job.py --data DIR --plan PLAN.json --out result.json

(or ``python -m paddle.distributed.launch $(heterps launch-args PLAN.json) --log_dir LOG ...``).
Without ``--plan`` it is the same job as plain async PS: the unsplit reference.

Model and data are the project's shared ones: ``examples/ctr_dnn`` (26 slots sharing one table, sum
pooling, 13 dense features, fc layers, 2-way softmax; here with smaller fc layers, ``--fc``) and the
generator of ``heterps gen-data`` (``gen`` below writes it).  Layers as the planning profiler names
them: ``embedding_0``, ``fc_0`` .. ``fc_<n>`` (the last one holds the softmax, the loss and the AUC).

Every epoch's files go through one ``train_from_dataset`` call (heterogeneous trainers serve one
call for the whole job).  At the end CPU trainer 0 evaluates held-out AUC with the servers'
parameters (runtime.sectioned_eval) and each process writes its figures to ``--out.<role><id>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def gen(out: str, rows: int, seed: int, test_fraction: float = 0.25):
    from heterps_paddle.data.generator import generate

    return generate(out, rows, seed, test_fraction)


def _meta(data_dir: str):
    from heterps_paddle.data.generator import load_meta

    meta = load_meta(data_dir)
    if meta is None:
        raise SystemExit(f"ctr_job: {data_dir} holds no generated data set (run: ctr_job.py gen --out {data_dir})")
    return meta


def _embedding_moved(exe, eval_prog, scope, feeds, multislot_file: str, rows: int = 256) -> float:
    """Fraction of looked-up embedding values (first slot, held-out rows) outside the initialiser's
    range (+-0.05): the servers' sparse table learned only if sparse gradients reached it."""
    import numpy as np
    import paddle

    lines = open(multislot_file).read().split("\n")[:rows]
    cols = {v.name: [] for v in feeds}
    lods = {v.name: [] for v in feeds}
    for line in lines:
        tok = line.split()
        pos = 0
        for v in feeds:
            n = int(tok[pos])
            cols[v.name].extend(tok[pos + 1:pos + 1 + n])
            lods[v.name].append(n)
            pos += 1 + n
    feed = {}
    for v in feeds:
        if v.lod_level:
            arr = np.array(cols[v.name], dtype="int64").reshape(-1, 1)
            feed[v.name] = paddle.base.create_lod_tensor(arr, [lods[v.name]], paddle.CPUPlace())
        else:
            dtype = "int64" if "int" in str(v.dtype) else "float32"
            feed[v.name] = np.array(cols[v.name], dtype=dtype).reshape(len(lines), -1)
    lookup = next(op for op in eval_prog.global_block().ops if op.type == "distributed_lookup_table")
    out = exe.run(eval_prog, feed=feed, fetch_list=[lookup.output("Outputs")[0]], scope=scope,
                  return_numpy=False)[0]
    return float((np.abs(np.asarray(out)) > 0.05).mean())


def train(args) -> int:
    import paddle
    import paddle.distributed.fleet as fleet

    import heterps_paddle  # noqa: F401  (installs strategy.heterps)
    from heterps_paddle.data import dataset as data
    from heterps_paddle.fleet.evaluation import accumulated_auc
    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig
    from heterps_paddle.runtime import sections as runtime

    fault = os.environ.get("HETERPS_JOB_FAULT", "")  # fault injection for the tests (docs/sections.md)
    if fault == "heter_never_starts" and runtime.role() == "heter":
        print("heterps-job: injected fault: this heterogeneous trainer exits before starting", flush=True)
        os._exit(1)

    paddle.enable_static()
    paddle.seed(args.seed)
    fleet.init()
    main, startup = paddle.static.default_main_program(), paddle.static.default_startup_program()
    main.random_seed = startup.random_seed = args.seed
    config = ModelConfig(sparse_feature_dim=args.emb_dim, fc_sizes=tuple(args.fc), embedding="ps",
                         learning_rate=args.lr)
    model = build_net("ctr_dnn", config)
    # The whole model's forward pass, kept before minimize splits it: held-out evaluation runs it.
    test_program, test_startup = main.clone(for_test=True), startup.clone()

    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    if args.plan:
        strategy.heterps = True
        strategy.heterps_configs = {"plan": args.plan}
        strategy.pipeline_configs = {"accumulate_steps": args.microbatches}
    opt = fleet.distributed_optimizer(paddle.optimizer.Adam(args.lr), strategy)
    opt.minimize(model.loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    # This script drives every stage itself (below); without this the extension would take heterogeneous
    # trainers over in init_worker, as it does behind an unchanged plain-PS script (sections/dropin.py).
    runtime.section_aware()
    fleet.init_worker()
    program = paddle.static.default_main_program()
    # The loss and AUC live in the last stage's section, inside its heter block (not block 0).
    fetch = [blk.vars[v.name] for v in (model.loss, model.auc) for blk in program.blocks if v.name in blk.vars][:2]
    meta = _meta(args.data)
    rows = 0
    if runtime.role() == "heter":
        dataset = runtime.heter_worker_dataset(program)
    else:
        mine = data.shard(list(meta.train_files), fleet.worker_index(), fleet.worker_num())
        files, report = data.prepare_multislot(mine)
        rows = report.rows * args.epochs
        dataset = data.make_dataset(model.feeds, files * args.epochs, args.batch)
    if fault.startswith("heter_dies_after=") and runtime.role() == "heter":
        import threading

        delay = float(fault.split("=", 1)[1])

        def die():
            time.sleep(delay)
            print(f"heterps-job: injected fault: heterogeneous trainer pid {os.getpid()} dies now", flush=True)
            os._exit(1)

        threading.Thread(target=die, daemon=True).start()
    t0 = time.time()
    exe.train_from_dataset(program, dataset, fetch_list=fetch, fetch_info=["loss", "auc"][:len(fetch)] or None,
                           print_period=args.print_period, debug=False)
    t1 = time.time()
    print(f"heterps-job: role={runtime.role()} stage={runtime.stage_id()} train_start={t0:.3f} "
          f"train_end={t1:.3f} rows={rows}", flush=True)

    result = {"role": runtime.role(), "stage": runtime.stage_id(), "train_start": t0, "train_end": t1,
              "rows": rows}
    if runtime.role() == "trainer" and fleet.worker_index() == 0:
        test_files, _ = data.prepare_multislot(list(meta.test_files))
        eval_prog, eval_scope, pulled = runtime.sectioned_eval(exe, test_program, test_startup)
        test_set = data.make_dataset(model.feeds, test_files, 512)
        exe.train_from_dataset(program=eval_prog, dataset=test_set, scope=eval_scope, print_period=10**9)
        result["heldout_auc"] = accumulated_auc(eval_scope, model.auc_states)
        result["sparse_rows_moved"] = _embedding_moved(exe, eval_prog, eval_scope, model.feeds, test_files[0])
        result["dense_vars_pulled"] = pulled
        result["bayes_test_auc"] = meta.bayes_test_auc
        print(f"heterps-job: heldout_auc={result['heldout_auc']:.5f} (best possible "
              f"{meta.bayes_test_auc:.4f}; dense vars from servers: {len(pulled)})", flush=True)
    if args.out:
        ident = f"{runtime.stage_id()}.{os.environ.get('PADDLE_PORT', '0')}" if runtime.role() == "heter" \
            else str(fleet.worker_index())
        with open(f"{args.out}.{runtime.role()}{ident}", "w") as f:
            json.dump(result, f)
    fleet.stop_worker()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "gen":
        p = argparse.ArgumentParser(prog="ctr_job gen")
        p.add_argument("--out", required=True)
        p.add_argument("--rows", type=int, default=20000)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--test_fraction", type=float, default=0.25)
        a = p.parse_args(argv[1:])
        meta = gen(a.out, a.rows, a.seed, a.test_fraction)
        print(json.dumps({"train_rows": meta.train_rows, "test_rows": meta.test_rows,
                          "bayes_test_auc": meta.bayes_test_auc}))
        return 0
    p = argparse.ArgumentParser(prog="ctr_job")
    p.add_argument("--data", required=True, help="a directory written by `ctr_job.py gen` / `heterps gen-data`")
    p.add_argument("--plan", default=None)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--fc", type=int, nargs="+", default=[64, 64])
    p.add_argument("--emb_dim", type=int, default=9)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--print_period", type=int, default=20)
    p.add_argument("--out", default=None)
    return train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
