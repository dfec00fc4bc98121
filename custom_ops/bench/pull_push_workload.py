"""A fixed pull/push workload on the CPU core, for instruction counts that do not move with the machine's load:

    HETERPS_OPS_DIR=DIR valgrind --tool=callgrind python custom_ops/bench/pull_push_workload.py [--ssd]

(compare two builds of libheterps_table.so by pointing HETERPS_OPS_DIR at each; wall-clock figures are
`heterps bench table`'s).  Default: 128k rows of dim 64, Adagrad, all in memory; one pull of every row, then
3 x (pull and push of 64k uniform ids).  ``--ssd``: 128k rows of dim 16, Adagrad, a memory budget of a quarter of
them (three quarters on the SSD tier: promotion, eviction, compaction and the records' checksums), same calls."""

import argparse
import tempfile

import numpy as np

from heterps_paddle.table.sparse_table import SparseTable

parser = argparse.ArgumentParser()
parser.add_argument("--ssd", action="store_true", help="dim 16 with three quarters of the rows on the SSD tier")
args = parser.parse_args()
rows = 131072
dim = 16 if args.ssd else 64
with tempfile.TemporaryDirectory() as ssd_dir:
    if args.ssd:  # a quarter of the rows' cost (Adagrad: 2 x dim floats + 32 bytes of index a row)
        t = SparseTable(
            dim=dim, optimizer="adagrad", lr=0.01, memory_budget_bytes=rows * (8 * dim + 32) // 4, ssd_dir=ssd_dir
        )
    else:
        t = SparseTable(dim=dim, optimizer="adagrad", lr=0.01)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, 65536, dtype=np.int64)
    out = np.empty((ids.size, dim), np.float32)
    t.pull(np.arange(rows, dtype=np.int64), out=np.empty((rows, dim), np.float32))
    for _ in range(3):
        t.pull(ids, out=out)
        t.push(ids, out * 0.01)
    t.close()
