"""``heterps bench table``: sparse-table pull/push rows/s against references measured in the same run.

For each dim and id distribution (Zipf(1.1) and uniform over the key space) the table is measured
(a) with every row in memory and (b) with a memory budget of a quarter of the rows, so that three
quarters live in the SSD tier.  References: a numpy gather of the same ids from a dense array (the
memory-bound ceiling for a lookup here) and a Python dict of rows (the naive way).  The table is called
through the ctypes binding with a whole batch per call into a reused numpy buffer, so the per-call
overhead is one foreign call, not one per id.

``--host-tier`` measures instead what the GPU table's tiers cost on the host (issue 42): the host tier's batch
calls, ``take_rows`` (a promotion: rows out of the host table) and ``put_rows`` (an eviction: rows into it), rows/s
in and out for each thread count of ``--threads`` (the table's ``host_threads``), one table per count filled alike
and driven with the same batches, interleaved batch by batch; ratios are against the 1-thread table of the same
run, and every table must end with the 1-thread table's rows (else exit 1).

No Paddle import: the table core does not need it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from heterps_paddle.files import output_dir
from heterps_paddle.table.sparse_table import SparseTable, SparseTableError

TARGETS = {
    "pull_vs_numpy_min": 0.5,  # in-memory pull >= 0.5x the numpy gather
    "pull_vs_dict_min": 30.0,  # in-memory pull >= 30x the Python dict
    "ssd_zipf_vs_memory_min": 0.25,  # SSD mode, Zipf ids >= 0.25x in-memory
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--host-tier",
        action="store_true",
        help="measure the host tier's batch calls (take_rows / put_rows: the GPU table's promotions and evictions on "
        "the host) for each of --threads instead of pull/push",
    )
    parser.add_argument(
        "--threads",
        default=None,
        help="--host-tier: comma-separated host_threads to measure (default 1, 2, 4, ... up to and with every CPU this "
        "process may use); 1, the baseline, is always measured",
    )
    parser.add_argument("--dims", default=None, help="comma-separated row dims (default 8,16,64; --host-tier: 64)")
    parser.add_argument("--rows", type=int, default=1 << 20, help="key space: rows in the table (default 1Mi)")
    parser.add_argument("--batch", type=int, default=1 << 18, help="ids per pull/push call (default 256Ki)")
    parser.add_argument("--batches", type=int, default=9, help="timed batches per measurement (default 9)")
    parser.add_argument("--optimizer", default="adagrad", choices=("sgd", "adagrad", "adam"))
    parser.add_argument("--eviction", default="lru", choices=("lru", "lfu"), help="SSD-mode eviction policy")
    parser.add_argument("--ssd-dir", default=None, help="directory for the SSD tier (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)


def _zipf_ids(rng: np.random.Generator, n_keys: int, size: int, s: float = 1.1) -> npt.NDArray[np.int64]:
    """Bounded Zipf(s) over n_keys keys; ranks are scattered over the key space by a fixed permutation so
    hot keys are not neighbours in memory (numpy's zipf is unbounded and would clip into the last key)."""
    ranks = np.arange(1, n_keys + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-s)
    cdf /= cdf[-1]
    r = np.searchsorted(cdf, rng.random(size))
    perm = np.random.default_rng(12345).permutation(n_keys)
    ids: npt.NDArray[np.int64] = perm[np.minimum(r, n_keys - 1)].astype(np.int64)
    return ids


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def _timed(fn: Callable[..., object], arg: Any) -> float:
    t0 = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t0


def _make_table(
    sparse_table_cls: type[SparseTable],
    dim: int,
    optimizer: str,
    n_keys: int,
    budget: int,
    ssd_dir: str,
    name: str,
    eviction: str = "lru",
) -> SparseTable:
    kwargs: dict[str, Any] = {"memory_budget_bytes": budget, "ssd_dir": ssd_dir, "eviction": eviction} if budget else {}
    table = sparse_table_cls(dim=dim, optimizer=optimizer, lr=0.01, name=name, **kwargs)
    fill = np.arange(n_keys, dtype=np.int64)
    for i in range(0, n_keys, 1 << 18):  # create every row (spilling 3/4 of them in SSD mode)
        table.pull(fill[i : i + (1 << 18)])
    return table


def _measure(
    tables: dict[str, SparseTable],
    dense: npt.NDArray[np.float32],
    rows_dict: dict[int, npt.NDArray[np.float32]],
    batches: list[npt.NDArray[np.int64]],
    warm: list[npt.NDArray[np.int64]],
    dict_ids: int,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """Interleaves the references (numpy gather; dict of rows on the first `dict_ids` ids of each batch),
    table pulls and table pushes batch by batch, so that the load of this shared machine hits all of them
    alike.  Rates come from the median batch time; ratios are medians of the per-batch ratios."""
    n, dim = len(batches[0]), dense.shape[1]
    out = np.empty((n, dim), np.float32)
    grads = np.random.default_rng(1).normal(0, 0.01, size=(n, dim)).astype(np.float32)

    def naive(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return np.stack([rows_dict[k] for k in ids.tolist()])

    for b in warm:  # steady state: hot rows resident, buffers faulted in
        np.take(dense, b, axis=0, out=out)
        naive(b[:dict_ids])
        for t in tables.values():
            t.pull(b, out=out)
            t.push(b, grads)
    before = {m: t.stats() for m, t in tables.items()}
    per: dict[str, list[float]] = {"numpy": [], "dict": []}  # seconds per id
    for m in tables:
        per[m + "_pull"], per[m + "_push"] = [], []
    for b in batches:
        per["numpy"].append(_timed(lambda x: np.take(dense, x, axis=0, out=out), b) / n)
        per["dict"].append(_timed(naive, b[:dict_ids]) / dict_ids)
        for m, t in tables.items():
            per[m + "_pull"].append(_timed(lambda x, t=t: t.pull(x, out=out), b) / n)
        for m, t in tables.items():
            per[m + "_push"].append(_timed(lambda x, t=t: t.push(x, grads), b) / n)
    rates = {k: 1.0 / _median(v) for k, v in per.items()}

    def paired(a: str, b: str) -> float:  # rate(a) / rate(b), batch by batch
        return _median([tb / ta for ta, tb in zip(per[a], per[b])])

    results = {}
    for m, t in tables.items():
        after = t.stats()
        lookups = sum(after[k] - before[m][k] for k in ("hits", "misses"))
        results[m] = {
            "pull_rows_per_s": rates[m + "_pull"],
            "push_rows_per_s": rates[m + "_push"],
            "rows_in_memory": after["rows_in_memory"],
            "rows_on_ssd": after["rows_on_ssd"],
            "bytes_in_memory": after["bytes_in_memory"],
            "ssd_promotions_per_lookup": (after["ssd_promotions"] - before[m]["ssd_promotions"]) / max(1, lookups),
            "evictions": after["evictions"] - before[m]["evictions"],
            "spill_errors": after["spill_errors"],
        }
    ratios = {"pull_vs_numpy": paired("memory_pull", "numpy"), "pull_vs_dict": paired("memory_pull", "dict")}
    if "ssd" in tables:
        ratios["ssd_vs_memory_pull"] = paired("ssd_pull", "memory_pull")
        ratios["ssd_vs_memory_push"] = paired("ssd_push", "memory_push")
    refs = {"numpy_gather_rows_per_s": rates["numpy"], "python_dict_rows_per_s": rates["dict"]}
    return refs, results, ratios


def _int_list(option: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SparseTableError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise SparseTableError(f"{option} is empty")
    return values


def usable_cpus() -> int:
    """CPUs this process may run on (what the core's host_threads=0 uses: sched_getaffinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_thread_counts(cpus: int) -> list[int]:
    """1, 2, 4, ... below ``cpus``, and ``cpus`` itself."""
    counts = [1]
    while counts[-1] * 2 < cpus:
        counts.append(counts[-1] * 2)
    if cpus > 1:
        counts.append(cpus)
    return counts


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(args: argparse.Namespace) -> int:
    if args.host_tier:
        return run_host_tier(args)
    dims = _int_list("--dims", args.dims if args.dims is not None else "8,16,64")
    if args.rows < 1000 or args.batch < 1 or args.batches < 1:
        raise SparseTableError("--rows must be >= 1000, --batch and --batches >= 1")
    rng = np.random.default_rng(args.seed)
    own_tmp = args.ssd_dir is None
    ssd_dir = tempfile.mkdtemp(prefix="heterps-bench-") if own_tmp else output_dir("--ssd-dir", args.ssd_dir)
    results, refs, ratios = [], [], []
    try:
        for dim in dims:
            stride = dim + {"sgd": 0, "adagrad": dim, "adam": 2 * dim + 2}[args.optimizer]
            dense = rng.normal(size=(args.rows, dim)).astype(np.float32)
            d = {i: dense[i].copy() for i in range(args.rows)}
            for dist in ("zipf", "uniform"):

                def draw(dist: str = dist) -> npt.NDArray[np.int64]:
                    if dist == "zipf":
                        return _zipf_ids(rng, args.rows, args.batch)
                    ids: npt.NDArray[np.int64] = rng.integers(0, args.rows, args.batch, dtype=np.int64)
                    return ids

                batches = [draw() for _ in range(args.batches)]
                warm = [draw() for _ in range(2)]
                budget = (args.rows // 4) * (stride * 4 + 32)  # SSD mode: a quarter of the rows fit
                tables = {}
                try:
                    for mode, b in (("memory", 0), ("ssd", budget)):
                        tables[mode] = _make_table(
                            SparseTable,
                            dim,
                            args.optimizer,
                            args.rows,
                            b,
                            ssd_dir,
                            f"bench-{dim}-{dist}-{mode}-{os.getpid()}",
                            args.eviction,
                        )
                    ref, per_mode, ratio = _measure(tables, dense, d, batches, warm, min(args.batch, 32768))
                finally:
                    for t in tables.values():
                        t.close()
                ref.update({"dim": dim, "dist": dist})
                refs.append(ref)
                ratio.update({"dim": dim, "dist": dist})
                ratios.append(ratio)
                for mode, r in per_mode.items():
                    r.update(
                        {"dim": dim, "dist": dist, "mode": mode, "memory_budget_bytes": budget if mode == "ssd" else 0}
                    )
                    results.append(r)
            del dense, d
    finally:
        if own_tmp:
            shutil.rmtree(ssd_dir, ignore_errors=True)

    checks = {
        "pull_vs_numpy": all(r["pull_vs_numpy"] >= TARGETS["pull_vs_numpy_min"] for r in ratios),
        "pull_vs_dict": all(r["pull_vs_dict"] >= TARGETS["pull_vs_dict_min"] for r in ratios),
        "ssd_zipf_vs_memory": all(
            r["ssd_vs_memory_pull"] >= TARGETS["ssd_zipf_vs_memory_min"] for r in ratios if r["dist"] == "zipf"
        ),
    }
    report = {
        "benchmark": "table",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "config": {
            "rows": args.rows,
            "batch": args.batch,
            "batches": args.batches,
            "dims": dims,
            "optimizer": args.optimizer,
            "zipf_s": 1.1,
            "eviction": args.eviction,
            "ssd_mode": "memory budget = rows/4 x (row bytes + 32 index bytes)",
        },
        "results": results,
        "references": refs,
        "ratios": ratios,
        "targets": TARGETS,
        "targets_met": checks,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"sparse table, {args.rows} rows, batch {args.batch}, optimizer {args.optimizer}")
        print(f"{'dim':>4} {'dist':>8} {'mode':>7} {'pull rows/s':>13} {'push rows/s':>13} {'promo/lookup':>12}")
        for r in results:
            print(
                f"{r['dim']:>4} {r['dist']:>8} {r['mode']:>7} {r['pull_rows_per_s']:>13.3g} "
                f"{r['push_rows_per_s']:>13.3g} {r['ssd_promotions_per_lookup']:>12.4f}"
            )
        print(
            f"{'dim':>4} {'dist':>8} {'numpy rows/s':>13} {'dict rows/s':>13} {'vs numpy':>9} {'vs dict':>8} "
            f"{'ssd/mem':>8}"
        )
        for ref, ra in zip(refs, ratios):
            print(
                f"{ref['dim']:>4} {ref['dist']:>8} {ref['numpy_gather_rows_per_s']:>13.3g} "
                f"{ref['python_dict_rows_per_s']:>13.3g} {ra['pull_vs_numpy']:>9.2f} {ra['pull_vs_dict']:>8.1f} "
                f"{ra['ssd_vs_memory_pull']:>8.2f}"
            )
        print("targets met: " + ", ".join(f"{k}={v}" for k, v in checks.items()))
    return 0


def run_host_tier(args: argparse.Namespace) -> int:
    """The host tier's batch calls, rows/s in (put_rows) and out (take_rows) per thread count (module docstring).

    Every table holds ``--rows`` rows in memory (the GPU table's host tier has no budget unless given one); a batch
    is ``--batch`` distinct ids drawn uniformly (what a device evicts and misses is spread over the cold rows),
    taken out and put back, so every table stays full and the same."""
    dims = _int_list("--dims", args.dims if args.dims is not None else "64")
    cpus = usable_cpus()
    threads = _int_list("--threads", args.threads) if args.threads is not None else default_thread_counts(cpus)
    if any(t < 1 or t > 1024 for t in threads):
        raise SparseTableError(f"--threads must be in [1, 1024], got {threads}")
    threads = sorted(set(threads) | {1})
    if args.rows < 1000 or not 1 <= args.batch <= args.rows or args.batches < 1:
        raise SparseTableError("--rows must be >= 1000, --batch in [1, rows], --batches >= 1")
    rng = np.random.default_rng(args.seed)
    results: list[dict[str, Any]] = []
    all_identical = True
    for dim in dims:
        tables: dict[int, SparseTable] = {}
        try:
            for t in threads:
                tables[t] = SparseTable(
                    dim=dim,
                    optimizer=args.optimizer,
                    lr=0.01,
                    host_threads=t,
                    name=f"bench-tier-{dim}-{t}-{os.getpid()}",
                )
            stride = tables[1].stride
            fill_rng = np.random.default_rng(args.seed + 1)
            for i in range(0, args.rows, 1 << 16):
                ids = np.arange(i, min(args.rows, i + (1 << 16)), dtype=np.int64)
                rows = fill_rng.normal(0, 0.01, size=(ids.size, stride)).astype(np.float32)
                for table in tables.values():
                    table.put_rows(ids, rows)
            take_s: dict[int, list[float]] = {t: [] for t in threads}
            put_s: dict[int, list[float]] = {t: [] for t in threads}
            busy: dict[int, list[float]] = {t: [] for t in threads}  # this process's CPU seconds per wall second
            # one output buffer, reused (as the GPU table reuses its staging): the calls, not page faults, are timed
            taken = np.empty((args.batch, stride), dtype=np.float32)
            for b in range(args.batches + 1):  # the first batch warms up (threads started, buffers faulted in)
                ids = rng.choice(args.rows, size=args.batch, replace=False).astype(np.int64)
                for t, table in tables.items():
                    cpu_start = time.process_time()
                    start = time.perf_counter()
                    table.take_rows(ids, out=taken)
                    middle = time.perf_counter()
                    table.put_rows(ids, taken)
                    end = time.perf_counter()
                    if b:
                        take_s[t].append(middle - start)
                        put_s[t].append(end - middle)
                        busy[t].append((time.process_time() - cpu_start) / (end - start))
            everything = np.arange(args.rows, dtype=np.int64)
            reference, where = tables[1].peek(everything)
            for t in threads:
                rows_t, where_t = tables[t].peek(everything)
                identical = bool(np.array_equal(rows_t, reference) and np.array_equal(where_t, where))
                all_identical &= identical
                results.append(
                    {
                        "dim": dim,
                        "threads": t,
                        "take_rows_per_s": args.batch / _median(take_s[t]),
                        "put_rows_per_s": args.batch / _median(put_s[t]),
                        "take_vs_1_thread": _median([a / b for a, b in zip(take_s[1], take_s[t])]),
                        "put_vs_1_thread": _median([a / b for a, b in zip(put_s[1], put_s[t])]),
                        "cores_busy": _median(busy[t]),
                        "identical_to_1_thread": identical,
                    }
                )
        finally:
            for table in tables.values():
                table.close()
    cpu_model = _cpu_model()
    report = {
        "benchmark": "table-host-tier",
        "machine": {
            "cpu_model": cpu_model,
            "cpus": os.cpu_count(),
            "usable_cpus": cpus,
            "load_average_1m": os.getloadavg()[0],
            "platform": platform.platform(),
        },
        "config": {
            "rows": args.rows,
            "batch": args.batch,
            "batches": args.batches,
            "dims": dims,
            "optimizer": args.optimizer,
            "threads": threads,
            "ids": "distinct, uniform over the rows",
            "rates": "median batch; ratios: median of per-batch time ratios against host_threads=1",
            "cores_busy": "this process's CPU seconds per wall second during a batch's take and put (median)",
        },
        "results": results,
        "identical": all_identical,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"host tier batch calls: {args.rows} rows, batches of {args.batch} distinct ids, optimizer "
            f"{args.optimizer}, {cpus} usable CPUs ({cpu_model})"
        )
        print(
            f"{'dim':>4} {'threads':>7} {'take rows/s':>13} {'put rows/s':>13} {'take vs 1':>9} {'put vs 1':>9} "
            f"{'cores busy':>10}"
        )
        for r in results:
            print(
                f"{r['dim']:>4} {r['threads']:>7} {r['take_rows_per_s']:>13.3g} {r['put_rows_per_s']:>13.3g} "
                f"{r['take_vs_1_thread']:>9.2f} {r['put_vs_1_thread']:>9.2f} {r['cores_busy']:>10.2f}"
                + ("" if r["identical_to_1_thread"] else "  ROWS DIFFER from 1 thread")
            )
    if not all_identical:
        print("heterps bench table --host-tier: a table's rows differ from the 1-thread table's", file=sys.stderr)
        return 1
    return 0
