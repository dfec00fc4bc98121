"""``heterps plan``: a model profile and a cluster in, a plan out (docs/plan-formats.md).

Human-readable summary by default, ``--json`` for exactly one JSON object on stdout (logs on stderr).
Invalid input raises ``PlanningInputError`` (exit 2 from the CLI); an infeasible target is still printed
(``"feasible": false`` with a ``"reason"``) but exits 1, with the target, the reason and the most samples/s any
plan reaches on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from heterps_paddle.errors import EXIT_INFEASIBLE, EXIT_OK
from heterps_paddle.files import input_file, output_file, pyplot, save_figure_atomic
from heterps_paddle.planning.budget import BUDGET_TOLERANCE
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import (
    RESOURCE_KINDS,
    Plan,
    PlanningInputError,
    load_cluster,
    load_model_profile,
    save_plan,
    unknown_time_keys,
)
from heterps_paddle.planning.planner import budget_plan, infeasible_lines, make_plans
from heterps_paddle.planning.report import best_single_type, format_summary, single_kind_plans
from heterps_paddle.planning.schedulers import SCHEDULERS
from heterps_paddle.text_numbers import ascii_float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model profile (YAML/JSON), e.g. from `heterps profile`")
    parser.add_argument("--cluster", required=True, help="cluster description (YAML/JSON)")
    parser.add_argument("--scheduler", default="rl", choices=SCHEDULERS, help="search method (default: rl)")
    parser.add_argument(
        "--throughput",
        default=None,
        help="required samples/s, overriding the cluster file's; a comma list (1e5,2e5,4e5) sweeps",
    )
    parser.add_argument(
        "--budget",
        default=None,
        metavar="PRICE_PER_HOUR",
        help="instead of a throughput: the most samples/s a plan gives at no more than this price per hour "
        "(the cluster file's currency)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the randomised schedulers")
    parser.add_argument(
        "--trainer-kinds",
        default="cpu,gpu",
        help="kinds a one-stage plan's trainers may be (default cpu,gpu; cpu where Paddle has no CUDA); a split "
        "plan's first stage is always a cpu type (Paddle's heterogeneous pipeline reads data there)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--out", default=None, help="also write the plan JSON here (with a sweep: the last plan)")
    parser.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="draw cost against throughput and each plan as a band of layer -> type (matplotlib)",
    )


def positive_number(option: str, text: str) -> float:
    """A command-line number that must be positive and finite (--throughput's, --budget's)."""
    try:
        value = ascii_float(text.strip())  # spaces after a list's commas are the list's, not the number's
    except ValueError:
        raise PlanningInputError(f"{option}: {text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise PlanningInputError(f"{option}: must be positive and finite, got {text!r}")
    return value


def parse_throughputs(text: str | None) -> list[float | None]:
    if text is None:
        return [None]
    return [positive_number("--throughput", part) for part in text.split(",")]


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in RESOURCE_KINDS]
    if not kinds or bad:
        raise PlanningInputError(f"--trainer-kinds: give kinds among {', '.join(RESOURCE_KINDS)}, got {text!r}")
    return kinds


def budget_goal(args: argparse.Namespace) -> float:
    """--budget's price per hour (not with --throughput: a budget replaces the target)."""
    if args.throughput is not None:
        raise PlanningInputError("give --throughput (the cheapest plan that meets it) or --budget, not both")
    return positive_number("--budget", args.budget)


def run(args: argparse.Namespace) -> int:
    input_file("--model", args.model)
    # --cluster: load_cluster's own words for a missing file or a directory (no option name), which
    # strategy.heterps_configs['cluster'] gives too (tests/test_bad_input.py holds them to be the same)
    for option, path in (("--out", args.out), ("--plot", args.plot)):
        if path:
            output_file(option, path)
    profile = load_model_profile(args.model)
    cluster = load_cluster(args.cluster)
    unknown = unknown_time_keys(profile, cluster)
    if unknown:
        print(
            f"heterps plan: warning: {args.model}: measured times for {', '.join(unknown)}, which "
            f"{args.cluster} does not define; estimates are used for every type",
            file=sys.stderr,
        )
    trainer_kinds = parse_kinds(args.trainer_kinds)
    heading = None
    if args.budget is not None:
        within = budget_plan(profile, cluster, budget_goal(args), args.scheduler, args.seed, trainer_kinds)
        plan, searches = within.plan, within.searches
        results = [(within.cost_model, plan)]
        heading = (
            f"budget {plan.budget_per_hour:.4g}/h: the most samples/s a plan gives within it ({args.scheduler}, "
            f"{searches} searches over the target, within {BUDGET_TOLERANCE:.1%})"
        )
    else:
        throughputs = parse_throughputs(args.throughput)
        if throughputs == [None] and cluster.throughput is None:
            raise PlanningInputError(f"{args.cluster}: throughput: missing (give it in the file or with --throughput)")
        results = make_plans(profile, cluster, args.scheduler, throughputs, args.seed, trainer_kinds)
    if args.out:
        save_plan(results[-1][1], args.out)
    if args.plot:
        plot_plans(results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        if len(results) == 1:
            document = results[0][1].to_dict()
        else:
            document = {
                "format": 1,
                "scheduler": args.scheduler,
                "model": profile.name,
                "sweep": [plan.to_dict() for _, plan in results],
            }
        print(json.dumps(document))
    else:
        if heading is not None:
            print(heading)
        for cost_model, plan in results:
            print(format_summary(cost_model, plan))
    # An infeasible target or budget is an answer (printed above) but not a plan: a script or a job that goes on to
    # launch must not take it for one, so the exit status says so, and stderr why.
    if args.budget is not None:
        answer = results[0][1]
        missed = [] if answer.feasible else [answer.reason or "no plan fits the budget"]
    else:
        missed = infeasible_lines(results, args.scheduler, trainer_kinds)
    for line in missed:
        print(f"heterps plan: infeasible: {line}", file=sys.stderr)
    return EXIT_INFEASIBLE if missed else EXIT_OK


def plot_plans(results: list[tuple[CostModel, Plan]], path: str) -> None:
    plt = pyplot()  # matplotlib is optional (the plot extra), and only --plot needs it
    from matplotlib.patches import Rectangle

    cost_model = results[0][0]
    type_names = [t.name for t in cost_model.types]
    figure, (curve, bands) = plt.subplots(
        2, 1, figsize=(10, 3 + 0.4 * len(results)), gridspec_kw={"height_ratios": [2, max(1, len(results) * 0.5)]}
    )
    feasible = [(m.throughput, p.cost_per_hour) for m, p in results if p.feasible]
    if feasible:
        xs, ys = zip(*feasible)
        curve.plot(xs, ys, "o-", label=results[0][1].scheduler)
        singles = [(m.throughput, s.cost_per_hour) for m, _ in results if (s := best_single_type(m))]
        if singles:
            curve.plot(*zip(*singles), "s--", label="best single type")
        # All-CPU and all-GPU too, as the summary prints them: what a mixed cluster saves against either kind.
        for kind, marker in zip(RESOURCE_KINDS, ("v:", "^:")):
            alts = [(m.throughput, a.cost_per_hour) for m, _ in results if (a := single_kind_plans(m).get(kind))]
            if alts:
                curve.plot(*zip(*alts), marker, label=f"all-{kind.upper()}")
    targets = [m.throughput for m, _ in results]
    if max(targets) > 20 * min(targets):  # a sweep over decades reads better on a log axis
        curve.set_xscale("log")
    curve.set_xlabel("required throughput (samples/s)")
    curve.set_ylabel("cost per hour")
    curve.legend()
    curve.set_title(f"{cost_model.profile.name}: cost against throughput")
    colours = plt.get_cmap("tab20")
    for row, (model, plan) in enumerate(results):
        if not plan.feasible:
            continue
        for index, name in enumerate(model.profile.layer_names()):
            t = type_names.index(plan.assignment[name])
            bands.barh(row, 1, left=index, color=colours(t % 20))
    bands.set_yticks(range(len(results)))
    bands.set_yticklabels([f"{m.throughput:,.0f}/s" for m, _ in results])
    bands.set_xlabel("layer (program order)")
    handles = [Rectangle((0, 0), 1, 1, color=colours(i % 20)) for i in range(len(type_names))]
    bands.legend(handles, type_names, fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    save_figure_atomic(figure, path)
    plt.close(figure)
