"""A fixed pull/push workload on the CPU core, for instruction counts that do not move with the machine's load:

    HETERPS_OPS_DIR=DIR valgrind --tool=callgrind python custom_ops/bench/pull_push_workload.py

(compare two builds of libheterps_table.so by pointing HETERPS_OPS_DIR at each; wall-clock figures are
`heterps bench table`'s).  128k rows of dim 64, Adagrad; one pull of every row, then 3 x (pull and push of 64k
uniform ids)."""

import numpy as np

from heterps_paddle.table.sparse_table import SparseTable

t = SparseTable(dim=64, optimizer="adagrad", lr=0.01)
rng = np.random.default_rng(0)
ids = rng.integers(0, 131072, 65536, dtype=np.int64)
out = np.empty((ids.size, 64), np.float32)
t.pull(np.arange(131072, dtype=np.int64), out=np.empty((131072, 64), np.float32))
for _ in range(3):
    t.pull(ids, out=out)
    t.push(ids, out * 0.01)
