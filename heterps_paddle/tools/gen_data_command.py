"""``heterps gen-data``: write the synthetic Criteo-format data set (data/generator.py)."""

from __future__ import annotations

import argparse
import json

from heterps_paddle.data.generator import generate
from heterps_paddle.errors import CommandError
from heterps_paddle.files import output_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, required=True, help="training rows to write")
    parser.add_argument("--out", required=True, help="output directory (train/, test/, meta.json)")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=0.1,
        help="held-out rows as a fraction of --rows, written to test/ (default 0.1)",
    )


def run(args: argparse.Namespace) -> int:
    if args.rows <= 0:
        raise CommandError(f"--rows must be positive, got {args.rows}")
    if not 0 < args.test_fraction < 1:
        raise CommandError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    output_dir("--out", args.out)
    result = generate(args.out, args.rows, args.seed, args.test_fraction)
    print(
        json.dumps(
            {
                "train_rows": result.train_rows,
                "test_rows": result.test_rows,
                "train_files": len(result.train_files),
                "test_files": len(result.test_files),
                "click_rate": round(result.click_rate, 4),
                "bayes_test_auc": round(result.bayes_test_auc, 4),
                "out": args.out,
            }
        )
    )
    return 0
