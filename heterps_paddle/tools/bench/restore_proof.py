"""``heterps bench restore-proof``: what proving a restore costs a sparse table of 10^7 or 10^8 rows (issue 63).

A resume proves what the servers hold by reading a save of every sparse table (runtime/restore_check.py), so its
cost grows with the table.  This writes a synthetic table in Paddle's text (a key and 13 values of 6 significant
digits a row, 24 shard files, each key in shard ``key % 24``; kept in ``--dir`` and reused) and measures, in one
run:

- ``read_s``: reading the files' bytes and nothing else (the floor of any proof that reads them);
- ``proof_s``: the proof, :func:`runtime.row_digest.table_rows` (every row hashed and checked for its shard);
- ``per_row_python_s``: the earlier proof's per-row Python parse (a row's key read a line at a time, every row of
  the first ``--python-files`` files, scaled to the table by bytes), the baseline it replaced.

Ratios: ``proof_over_read`` and ``proof_over_per_row_python``.  No Paddle.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from heterps_paddle.runtime import row_digest, shard_lines
from heterps_paddle.runtime.table_shards import row_key, shard_files

SHARDS = 24
VALUES = 13  # a row's values after its key: about 140 bytes a row, as a small embedding with its optimizer state
BATCH_ROWS = 200_000  # rows formatted at once while writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the synthetic table (default 10^7)")
    parser.add_argument("--dir", default="/tmp/heterps-restore-proof", help="where the table is written and kept")
    parser.add_argument("--python-files", type=int, default=2, help="shard files the per-row baseline reads")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def write_table(directory: str, rows: int, seed: int = 0) -> str:
    """A table of ``rows`` distinct keys in SHARDS files under ``directory/<rows>``, written once."""
    table = os.path.join(directory, str(rows))
    done = os.path.join(table, "done")
    if os.path.exists(done):
        return table
    os.makedirs(table, exist_ok=True)
    rng = np.random.default_rng(seed)
    suffixes = [" ".join(f"{v:.6g}" for v in rng.normal(size=VALUES)) for _ in range(4096)]
    outputs = [open(os.path.join(table, f"part-000-{s:05d}"), "w") for s in range(SHARDS)]
    try:
        step = 2**63 // rows  # distinct keys spread over the space: key i*step + a jitter under the step
        for begin in range(0, rows, BATCH_ROWS):
            index = np.arange(begin, min(begin + BATCH_ROWS, rows), dtype=np.uint64)
            keys = index * np.uint64(step) + rng.integers(0, step, index.size, dtype=np.uint64)
            shards = (keys % np.uint64(SHARDS)).astype(np.int64)
            for s in range(SHARDS):
                chosen = keys[shards == s].tolist()
                outputs[s].write("".join(f"{k} {suffixes[k & 4095]}\n" for k in chosen))
    finally:
        for out in outputs:
            out.close()
    open(done, "w").close()
    return table


def measure(table: str, python_files: int) -> dict[str, Any]:
    files = shard_files(table)
    size = sum(os.path.getsize(f) for f in files)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    proven = row_digest.table_rows([files])
    proof_s = time.perf_counter() - start
    sample = files[: max(1, python_files)]
    start = time.perf_counter()
    for path in sample:
        for number, line in enumerate(shard_lines.lines(path), 1):
            if line.strip():
                row_key(line, path, number)
    python_s = (time.perf_counter() - start) * size / sum(os.path.getsize(f) for f in sample)
    return {
        "rows": proven.rows,
        "bytes": size,
        "threads": max(1, min(os.cpu_count() or 1, row_digest.THREADS, len(files))),
        "read_s": round(read_s, 3),
        "proof_s": round(proof_s, 3),
        "proof_rows_per_s": round(proven.rows / proof_s),
        "proof_mb_per_s": round(size / proof_s / 1e6, 1),
        "per_row_python_s": round(python_s, 3),
        "proof_over_read": round(proof_s / read_s, 2),
        "proof_over_per_row_python": round(proof_s / python_s, 3),
    }


def run(args: argparse.Namespace) -> int:
    if args.rows <= 0:
        raise SystemExit(f"heterps bench restore-proof: --rows must be positive, got {args.rows}")
    start = time.perf_counter()
    table = write_table(args.dir, args.rows)
    written_s = time.perf_counter() - start
    figures = {"table": table, "written_s": round(written_s, 1), **measure(table, args.python_files)}
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    return 0
