"""A saved PaddleRec rank model scored on held-out rows with Paddle alone (it never imports heterps_paddle), loaded
the way a serving job loads what ``fleet.save_inference_model`` wrote: launched as plain Paddle PS (1 server,
1 worker), the server starts from the saved sparse tables (``fleet.init_server(model_dir)``), the worker loads the
saved dense parameters (``fleet.load_inference_model``, which pushes them to the server too), runs the model's
forward program over the held-out rows and writes the rank AUC of its predictions (the input of the model's AUC
op) to ``<out>/eval.json``.

    python -m paddle.distributed.launch --server_num=1 --worker_num=1 paddlerec_rank_eval.py \
        -m tests/data/paddlerec_models/dlrm/config_cpups.yaml --model DIR/1 --data GENERATED_DIR --out OUT
"""

import argparse
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet
from paddlerec_models_common import convert, feed_batches, load_config, rank_auc, static_model

WRITES_TO_SERVERS = ("distributed_push_sparse", "push_sparse", "push_sparse_v2", "send")


def saved_layout(strategy, model_dir):
    """The shard count each sparse table was saved in (heterps_tables.json beside a heterps job's save): a plain
    Paddle server loads a table only into the count it was saved with."""
    layout = os.path.join(model_dir, "heterps_tables.json")
    if os.path.isfile(layout):
        with open(layout, encoding="utf-8") as f:
            for table in json.load(f)["tables"].values():
                entry = strategy.sparse_table_configs.add()
                entry.table_name = table["name"]
                entry.shard_num = int(table["shard_num"])


def forward_only(program):
    """The worker program without the ops that write to the servers, in test mode (a prediction changes nothing)."""
    test = program.clone(for_test=True)
    block = test.global_block()
    for index in reversed(range(len(block.ops))):
        if block.ops[index].type in WRITES_TO_SERVERS:
            block._remove_op(index, sync=False)
    test._sync_with_cpp()
    return test


def prediction_var(program):
    """What the model predicts: the input of its AUC op (the accumulating one, the last a paddle.static.auc adds)."""
    ops = [op for op in program.global_block().ops if op.type == "auc"]
    if not ops:
        raise SystemExit("the model has no auc op: its prediction is not known")
    return ops[-1].input("Predict")[0]


def main(args):
    if any(name == "heterps_paddle" or name.startswith("heterps_paddle.") for name in sys.modules):
        raise SystemExit("paddlerec_rank_eval.py must not import heterps_paddle")
    paddle.enable_static()
    fleet.init()
    config = load_config(args.config)
    model = static_model(config)
    feeds = model.create_feeds()
    model.net(feeds)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    saved_layout(strategy, args.model)
    model.create_optimizer(strategy)  # the training job's optimizer: the servers' tables hold its state
    if fleet.is_server():
        fleet.init_server(args.model)
        fleet.run_server()
        return
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    fleet.load_inference_model(args.model, mode=0)
    program = forward_only(paddle.static.default_main_program())
    predict = prediction_var(program)
    with open(os.path.join(args.data, "meta.json"), encoding="utf-8") as f:
        test_files = json.load(f)["test_files"]
    labels, scores = [], []
    for path in convert(sorted(test_files), os.path.join(args.out, "multislot-test")):
        for label, ids, dense in feed_batches(path, 512):
            feed = {feeds[0].name: label, feeds[-1].name: dense}
            feed.update({var.name: column for var, column in zip(feeds[1:-1], ids)})
            (out,) = exe.run(program, feed=feed, fetch_list=[predict])
            labels.append(label.reshape(-1))
            scores.append(np.array(out)[:, -1])  # the positive class's probability, as the AUC op reads it
    labels, scores = np.concatenate(labels), np.concatenate(scores)
    result = {"model": args.model, "test_auc": rank_auc(labels, scores), "test_rows": int(len(labels))}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    print(f"held-out AUC {result['test_auc']:.4f} on {result['test_rows']} rows", flush=True)
    fleet.stop_worker()


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--config", required=True)
    parser.add_argument("--model", required=True, help="a fleet.save_inference_model directory")
    parser.add_argument("--data", required=True, help="the generated data set (its held-out files)")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
