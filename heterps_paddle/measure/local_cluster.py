"""A cluster description of *this* machine, so the whole HeterPS path runs here and in CI.

Two resource types, both backed by this machine's cores:
- ``local_cpu``: CPU trainer processes (the data-reading stage);
- ``local_gpu``: kind ``gpu`` in the plan, run as heterogeneous trainers.  With the CPU wheel they run on
  CPUPlace (``--heter_devices=cpu``); with paddlepaddle-gpu and a GPU present, on the GPU.

A unit is one trainer process running one thread, so each type may have as many units as there are
cores.  The figures are measured with small numpy/socket/disk probes (a second or two); the profiler
records measured per-layer times under the same type names, and measured times override estimates in
the cost model, so these figures matter mainly for what is not measured (spill, boundary traffic).
Prices are nominal (1.0 per unit-hour): edit them to ask what-if questions.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from typing import Callable

import numpy as np
import psutil

from heterps_paddle.planning.model import Cluster, ResourceType

LOCAL_CPU = "local_cpu"
LOCAL_GPU = "local_gpu"
LOCAL_KINDS = {LOCAL_CPU: "cpu", LOCAL_GPU: "gpu"}


def _best_of(fn: Callable[[], float], repeats: int = 3) -> float:
    return min(fn() for _ in range(repeats))


def measure_flops() -> float:
    """Sustained float32 FLOP/s of a matrix product (what fc layers do)."""
    a = np.random.default_rng(0).random((512, 512), dtype=np.float32)

    def once() -> float:
        start = time.perf_counter()
        for _ in range(8):
            a @ a
        return time.perf_counter() - start

    return 8 * 2 * 512**3 / _best_of(once)


def measure_gather_bandwidth() -> float:
    """Bytes/s of gathering random rows from a table larger than the caches (what sparse lookups do)."""
    rng = np.random.default_rng(0)
    table = rng.random((1 << 20, 16), dtype=np.float32)  # 64 MiB
    ids = rng.integers(0, table.shape[0], 1 << 18)

    def once() -> float:
        start = time.perf_counter()
        np.take(table, ids, axis=0)
        return time.perf_counter() - start

    return ids.size * table.shape[1] * 4 / _best_of(once)


def measure_loopback_bandwidth(total_bytes: int = 64 << 20) -> float:
    """Bytes/s through a loopback TCP connection (how trainers on this machine talk)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    payload = b"x" * (1 << 20)

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            for _ in range(total_bytes // len(payload)):
                conn.sendall(payload)

    sender = threading.Thread(target=send)
    start = time.perf_counter()
    sender.start()
    conn, _ = server.accept()
    received = 0
    with conn:
        while received < total_bytes:
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            received += len(chunk)
    sender.join()
    server.close()
    return received / (time.perf_counter() - start)


def measure_disk_bandwidth(directory: str | None = None, total_bytes: int = 64 << 20) -> float:
    """Bytes/s of writing (with fsync) and reading back a file: the SSD tier's rate, pessimistically."""
    block = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        start = time.perf_counter()
        for _ in range(total_bytes // len(block)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        f.seek(0)
        while f.read(1 << 20):
            pass
        return 2 * total_bytes / (time.perf_counter() - start)


def detect_local_cluster(ssd_dir: str | None = None, price_per_hour: float = 1.0) -> Cluster:
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    memory_per_unit = psutil.virtual_memory().total / (2 * cores)  # half the RAM for tables, split by unit
    disk = psutil.disk_usage(ssd_dir or tempfile.gettempdir())
    ssd_bw = measure_disk_bandwidth(ssd_dir) if disk.free > (1 << 30) else 0.0
    flops, mem_bw, net_bw = measure_flops(), measure_gather_bandwidth(), measure_loopback_bandwidth()
    types = tuple(
        ResourceType(
            name=name,
            kind=kind,
            price_per_hour=price_per_hour,
            max_units=cores,
            flops=flops,
            mem_bw=mem_bw,
            memory=memory_per_unit,
            net_bw=net_bw,
            ssd_bw=ssd_bw,
        )
        for name, kind in LOCAL_KINDS.items()
    )
    return Cluster(resource_types=types)
