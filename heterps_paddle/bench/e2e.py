"""``heterps bench e2e``: the same launched CTR job with heterps off and on, back to back.

Both runs use the same generated data, steps and seed; what is compared is samples/s (ratio on/off)
and held-out AUC.  With ``--reference`` a single-process run without parameter servers is added as
the learning reference.  The machine is shared and noisy: compare only figures from one run.
"""

from __future__ import annotations

import json
import sys
import tempfile


def add_arguments(parser) -> None:
    parser.add_argument("--model", action="append", choices=("ctr_dnn", "wide_deep", "deepfm"),
                        help="model to run (repeatable; default ctr_dnn)")
    parser.add_argument("--rows", type=int, default=200_000, help="generated training rows (default 200000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--reference", action="store_true", help="also run one process without a PS")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per job")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args) -> int:
    from ..jobs import JobSpec, run_job

    models = args.model or ["ctr_dnn"]
    overrides = {"generate_rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size}
    report = {"benchmark": "e2e", "rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size,
              "workers": args.workers, "servers": args.servers, "models": {}}
    for model in models:
        runs = {}
        variants = [("ps", dict(heterps=False)), ("heterps", dict(heterps=True))]
        if args.reference:
            variants.append(("single_process", dict(heterps=False, workers=0)))
        for name, kind in variants:
            spec = JobSpec(model=model, servers=args.servers, workers=kind.get("workers", args.workers),
                           heterps=kind["heterps"], overrides=overrides, timeout=args.timeout)
            print(f"bench e2e: {model} {name} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix=f"heterps-e2e-{model}-{name}-") as work_dir:
                runs[name] = run_job(spec, work_dir).summary()
        entry = {"runs": runs,
                 "samples_per_second_ratio": round(runs["heterps"]["samples_per_second"]
                                                   / runs["ps"]["samples_per_second"], 3),
                 "test_auc_difference": round(runs["heterps"]["test_auc"] - runs["ps"]["test_auc"], 4)}
        report["models"][model] = entry
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'model':10} {'run':15} {'samples/s':>10} {'held-out AUC':>13} {'wall s':>7}")
        for model, entry in report["models"].items():
            for name, r in entry["runs"].items():
                print(f"{model:10} {name:15} {r['samples_per_second']:>10.0f} {r['test_auc']:>13.4f} "
                      f"{r['wall_seconds']:>7.1f}")
            print(f"{model:10} heterps/ps samples/s ratio {entry['samples_per_second_ratio']:.3f}, "
                  f"AUC difference {entry['test_auc_difference']:+.4f}")
    return 0
