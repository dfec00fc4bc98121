"""A serving job for a saved CTR-DNN, written with Paddle alone (it never imports heterps_paddle): the way a user
loads what a training job saved, PaddleRec's ``static_ps_infer.py`` style.

Launched as plain Paddle PS (1 server, 1 worker): the server starts from the saved model's sparse tables
(``fleet.init_server(model_dir)``), the worker loads the saved dense parameters (``fleet.load_inference_model``,
which also pushes them to the server), then predicts the rows of ``reference.npz`` (written by the training job
next to its saves) and writes ``predictions.npz``.  ``--checkpoint DIR`` loads a ``fleet.save_persistables``
checkpoint instead (``fleet.load_model``: every table on the servers, dense ones included) and pulls the dense
tables into the worker before predicting.

    python -m paddle.distributed.launch --server_num=1 --worker_num=1 serve_saved_model.py \
        --model DIR/1 --reference DIR/reference.npz --out OUT --fc 64 64
"""

import argparse
import os
import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

NUM_DENSE, NUM_SPARSE = 13, 26


def network(args):
    """CTR-DNN as the training job built it (names matter: the saved files are named after the parameters)."""
    dense = paddle.static.data(name="dense_input", shape=[None, NUM_DENSE], dtype="float32")
    sparse = [
        paddle.static.data(name=f"C{i}", shape=[None, 1], lod_level=1, dtype="int64") for i in range(1, NUM_SPARSE + 1)
    ]
    label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
    pooled = []
    for ids in sparse:
        emb = paddle.static.nn.sparse_embedding(
            input=ids, size=[args.vocab, args.dim], param_attr=paddle.ParamAttr(name="SparseFeatFactors")
        )
        pooled.append(paddle.static.nn.sequence_lod.sequence_pool(paddle.reshape(emb, [-1, args.dim]), "sum"))
    x = paddle.concat(pooled + [dense], axis=1)
    for i, size in enumerate(args.fc):
        x = paddle.static.nn.fc(x, size=size, activation="relu", name=f"dnn_{i}")
    predict = paddle.static.nn.fc(x, size=2, activation="softmax", name="dnn_out")
    loss = paddle.mean(paddle.nn.functional.cross_entropy(predict, label, use_softmax=False))
    return [dense, *sparse, label], predict, loss


def forward_only(program):
    """The worker program without the ops that write to the servers (a prediction must change nothing)."""
    test = program.clone(for_test=True)
    block = test.global_block()
    for index in reversed(range(len(block.ops))):
        if block.ops[index].type in ("distributed_push_sparse", "push_sparse", "push_sparse_v2", "send"):
            block._remove_op(index, sync=False)
    test._sync_with_cpp()
    return test


def main(args):
    if any(name == "heterps_paddle" or name.startswith("heterps_paddle.") for name in sys.modules):
        raise SystemExit("serve_saved_model.py must not import heterps_paddle")
    paddle.enable_static()
    fleet.init()
    feeds, predict, loss = network(args)
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    # the training job's optimizer: the servers' tables hold its state, and a checkpoint's columns must match
    fleet.distributed_optimizer(paddle.optimizer.Adam(args.lr), strategy).minimize(loss)
    if fleet.is_server():
        fleet.init_server(args.checkpoint or args.model)
        fleet.run_server()
        return
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    if args.checkpoint:
        fleet.load_model(args.checkpoint, mode=0)
        runtime = fleet.fleet._runtime_handle  # Paddle has no public "pull the dense tables now"
        runtime._pull_all_dense(runtime.scopes, runtime._send_ctx, _dense_map(runtime))
    else:
        fleet.load_inference_model(args.model, mode=0)
    ref = np.load(args.reference)
    feed = {"dense_input": ref["dense"], "label": ref["label"]}
    for var in feeds[1:-1]:
        ids, lengths = ref[f"ids_{var.name}"], ref[f"len_{var.name}"]
        feed[var.name] = paddle.base.create_lod_tensor(ids.reshape(-1, 1), [lengths.tolist()], paddle.CPUPlace())
    (out,) = exe.run(forward_only(paddle.static.default_main_program()), feed=feed, fetch_list=[predict])
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "predictions.npz"), predict=np.array(out))
    print(f"served {len(out)} rows; max abs difference to the reference {np.abs(out - ref['predict']).max():.3g}")
    fleet.stop_worker()


def _dense_map(runtime):
    from paddle.distributed.ps.utils.public import get_the_one_recv_context

    return get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", help="a fleet.save_inference_model directory")
    parser.add_argument("--checkpoint", help="a fleet.save_persistables directory")
    parser.add_argument("--reference", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fc", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--dim", type=int, default=9)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--vocab", type=int, default=1000001)
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
