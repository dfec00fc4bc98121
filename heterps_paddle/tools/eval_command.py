"""``heterps eval``: the held-out AUC of a saved model, loaded the way a serving job loads it.

Launches the example trainer in its ``--eval-model`` mode as a plain Paddle parameter-server job (1 server,
1 trainer, no ``strategy.heterps``): the server starts from the saved model's sparse tables
(``fleet.init_server(DIR)``), the trainer loads its dense parameters with ``fleet.load_inference_model(DIR)``,
then runs the held-out pass of the model's config (its ``test_dir``, or the generated data set) and reports the
AUC.  The model directory is what ``fleet.save_inference_model`` wrote (``DIR/dnn_plugin``, ``DIR/000``), for
instance ``<model_save_path>/<epoch>`` of examples/static_ps_trainer.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from heterps_paddle.errors import CommandError
from heterps_paddle.files import input_dir, input_file, output_dir
from heterps_paddle.runtime import table_shards
from heterps_paddle.runtime.checkpoint_files import CheckpointError
from heterps_paddle.tools.jobs import launch

DEFAULT_TIMEOUT_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="a directory fleet.save_inference_model wrote")
    parser.add_argument(
        "-m", "--config", help="the run config the model was trained with (default: the installed ctr_dnn example's)"
    )
    parser.add_argument(
        "-o", "--override", action="append", default=[], metavar="KEY=VALUE", help="override a run config key"
    )
    parser.add_argument("--log-dir", help="where the evaluation job's logs go (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the job may take")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _check_layout_named(model: str, given: str) -> None:
    """The evaluation job is plain Paddle: it builds the sparse tables in the shard count the save's
    heterps_tables.json names (runtime/table_shards.py), or Paddle's default without one.  A model saved in another
    count with no such file would load as an empty table (Paddle says only a warning): refused, naming why."""
    try:
        saved = table_shards.saved_count(model)
    except CheckpointError as exc:
        raise CommandError(f"--model {given}: {exc}") from None
    named = os.path.isfile(os.path.join(model, table_shards.LAYOUT_FILE))
    if saved is not None and saved != table_shards.PADDLE_DEFAULT and not named:
        raise CommandError(
            f"--model {given}: its sparse tables were saved in {saved} shard files each and no "
            f"{table_shards.LAYOUT_FILE} names them (saved before heterps-paddle wrote one): a plain Paddle job "
            f"would load an empty table. Start a heterps job from it (init_model_path, with --heterps: it loads any "
            "count) and save it again"
        )


def run(args: argparse.Namespace) -> int:
    model = os.path.abspath(input_dir("--model", args.model))
    if not os.path.isdir(os.path.join(model, "dnn_plugin")):
        raise CommandError(f"--model {args.model}: no dnn_plugin/ there (not a fleet.save_inference_model directory)")
    _check_layout_named(model, args.model)
    if args.config is not None:
        input_file("--config", args.config)
    log_dir = output_dir("--log-dir", args.log_dir) if args.log_dir else tempfile.mkdtemp(prefix="heterps-eval-")
    # the installed examples (not in a source checkout's package): imported here, not when the CLI is built
    from heterps_paddle.examples import TRAINER_SCRIPT, model_config_path

    results = os.path.join(log_dir, "results")
    overrides = [a for item in args.override for a in ("-o", item)]
    argv = [
        TRAINER_SCRIPT,
        "-m",
        args.config or model_config_path("ctr_dnn"),
        *overrides,
        "--eval-model",
        model,
        "--result-dir",
        results,
    ]
    job = launch(["--server_num=1", "--worker_num=1"], argv, log_dir, timeout=args.timeout)
    result_path = os.path.join(results, "worker-0.json")
    if job.returncode != 0 or not os.path.isfile(result_path):
        tail = "\n".join(job.output.splitlines()[-12:])
        raise CommandError(f"the evaluation job failed (exit {job.returncode}, logs in {log_dir}):\n{tail}")
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    summary = {"model": model, "test_auc": result["test_auc"], "test_rows": result["test_rows"], "logs": log_dir}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"held-out AUC of {model}: {result['test_auc']:.4f} on {result['test_rows']} rows (logs in {log_dir})")
    return 0
