"""``heterps profile``: profile an example model's static program into a model profile file.

For any other program use the Python API: ``heterps_paddle.program.profiler.profile_program``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from heterps_paddle.files import output_file, write_atomic
from heterps_paddle.planning.model import PlanningInputError, model_profile_to_dict, save_yaml


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--example", required=True, help="example model: ctr_dnn, wide_deep or deepfm")
    parser.add_argument("--out", required=True, help="model profile file to write (.yaml or .json)")
    parser.add_argument("--batch-size", type=int, default=512, help="samples per batch (default 512)")
    parser.add_argument(
        "--time-as",
        default="local_cpu",
        help="resource type name the measured times are recorded under (default local_cpu; "
        "name a cluster type to let the plan use them for it)",
    )
    parser.add_argument("--steps", type=int, default=4, help="profiled steps (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random feed")
    parser.add_argument("--json", action="store_true", help="print a JSON summary (prediction check) on stdout")


def profile_example(
    name: str,
    batch_size: int = 512,
    seed: int = 0,
    time_key: str | None = "local_cpu",
    steps: int = 4,
    measure: bool = True,
    **config: Any,
) -> Any:
    """Profile one of the example CTR models with Adam applied (what training runs); a ProfileReport."""
    # Lazy: the profiler and the examples import Paddle (the CLI imports this module at start-up), and
    # heterps_paddle.examples exists only once installed (setup.py maps examples/ to it).
    import paddle

    from heterps_paddle.examples import build_program, random_feed
    from heterps_paddle.program.profiler import profile_program

    main, startup, model = build_program(name, **config)
    with paddle.static.program_guard(main, startup):
        paddle.optimizer.Adam(1e-3).minimize(model.loss)
    feed = random_feed(model, batch_size, seed)
    return profile_program(
        main,
        startup,
        feed,
        batch_size,
        fetch_list=[model.loss],
        name=name,
        time_key=time_key,
        steps=steps,
        measure=measure,
    )


def run(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.steps < 1:
        raise PlanningInputError("--batch-size and --steps must be >= 1")
    output_file("--out", args.out)  # before the examples (and Paddle) are imported and the model profiled
    from heterps_paddle.examples import MODELS  # lazy: see profile_example

    if args.example not in MODELS:
        raise PlanningInputError(f"--example: unknown model {args.example!r} (known: {', '.join(MODELS)})")
    report = profile_example(
        args.example, batch_size=args.batch_size, seed=args.seed, time_key=args.time_as, steps=args.steps
    )
    document = model_profile_to_dict(report.profile)
    if args.out.endswith(".json"):
        write_atomic(args.out, json.dumps(document, indent=2))
    else:
        save_yaml(document, args.out)
    summary = {
        "model": args.example,
        "layers": len(report.profile.layers),
        "out": args.out,
        "measured_step_seconds": report.measured_step_seconds,
        "predicted_step_seconds": report.predicted_step_seconds,
        "prediction_error": report.prediction_error,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {args.out}: {summary['layers']} layers; per-layer times sum to "
            f"{report.predicted_step_seconds * 1e3:.2f} ms per batch against a measured step of "
            f"{report.measured_step_seconds * 1e3:.2f} ms ({report.prediction_error:.1%} off)",
            file=sys.stderr,
        )
    return 0
