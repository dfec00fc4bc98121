"""``heterps status LOG_DIR [--json] [--plot FILE.png]``: what a running or finished job costs and delivers, from
its event log (the ``--log_dir`` of ``heterps launch``, on any host of the job: every host's log gets the job's
records from the coordinator).  The figures are launch/figures.py's, the same the metrics endpoint serves
(docs/metrics.md)."""

from __future__ import annotations

import argparse
import json
import os

from heterps_paddle.errors import CommandError
from heterps_paddle.files import input_dir, output_file, pyplot, save_figure_atomic
from heterps_paddle.launch import event_log
from heterps_paddle.launch.figures import JobFigures, of_log


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log_dir", metavar="LOG_DIR", help="the --log_dir of the job's heterps launch on this host")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        help="draw the rates beside the plan's, the target, the cost so far, and each round's cost per million "
        "samples beside its plan's, over time, rounds marked (PNG)",
    )


def run(args: argparse.Namespace) -> int:
    input_dir("log_dir", args.log_dir)
    if args.plot is not None:
        output_file("--plot", args.plot)
        pyplot()  # said before any work: the extra it needs
    if not os.path.isfile(event_log.path_in(args.log_dir)):
        raise CommandError(
            f"log_dir {args.log_dir}: no event log ({event_log.FILE}) there: is it the --log_dir of a heterps launch?"
        )
    figures = of_log(args.log_dir)
    if args.plot is not None:
        plot(figures, args.plot)
    if args.json:
        print(json.dumps(figures.to_dict()))
    else:
        print("\n".join(figures.lines()))
    return 0


def plot(figures: JobFigures, path: str) -> None:
    """Over the job's time, rounds marked: measured and predicted samples/s, the target and the cost so far (top);
    each round's cost per million samples so far beside what its plan predicted (bottom)."""
    plt = pyplot()  # matplotlib is optional (the plot extra), and only --plot needs it
    start = figures.started_at or (figures.series[0]["t"] if figures.series else 0.0)
    t = [(p["t"] - start) for p in figures.series]
    fig, (rates, money) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    rates.plot(t, [p["samples_per_s"] for p in figures.series], label="measured samples/s (last window)")
    rates.plot(t, [p["predicted_samples_per_s"] for p in figures.series], "--", label="predicted samples/s")
    if any(p["target_samples_per_s"] for p in figures.series):
        rates.plot(t, [p["target_samples_per_s"] for p in figures.series], ":", label="target")
    for change in figures.rounds:
        rates.axvline(change["at"] - start, color="grey", linewidth=0.8)
        rates.annotate(
            f"round {change['round']} ({change['kind']})", (change["at"] - start, 0), rotation=90, fontsize=7
        )
    money.set_xlabel("seconds since the launch started")
    rates.set_ylabel("samples/s")
    cost = rates.twinx()
    cost.plot(t, [p["cost_so_far"] for p in figures.series], color="tab:red", label="cost so far")
    cost.set_ylabel("cost so far")
    for number in sorted({p["round"] for p in figures.series if p.get("round") is not None}):
        points = [p for p in figures.series if p.get("round") == number]
        times = [p["t"] - start for p in points]
        money.plot(times, [p.get("cost_per_million_samples_over_round") for p in points], ".-", color=f"C{number % 10}")
        money.plot(
            times,
            [p.get("predicted_cost_per_million_samples") for p in points],
            "--",
            color=f"C{number % 10}",
            label=f"round {number}: measured (solid) and its plan's (dashed)",
        )
    for change in figures.rounds:
        money.axvline(change["at"] - start, color="grey", linewidth=0.8)
    money.set_ylabel("cost per million samples")
    if figures.series:
        money.legend(loc="best", fontsize=7)
    (rate_handles, rate_labels), (cost_handles, cost_labels) = (
        rates.get_legend_handles_labels(),
        cost.get_legend_handles_labels(),
    )
    rates.legend([*rate_handles, *cost_handles], [*rate_labels, *cost_labels], loc="upper left", fontsize=8)
    rates.set_title(f"job: {figures.state}, round {figures.round}")
    save_figure_atomic(fig, path)
    plt.close(fig)
