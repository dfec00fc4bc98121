"""Python face of the heterps sparse table (custom_ops/core) and its Paddle op (custom_ops/paddle).

``SparseTable`` talks to the core library through ctypes, so pulls and pushes of whole batches cost one
call each and work without Paddle.  ``sparse_embedding(input, table)`` is the layer for Paddle programs
(dynamic or static mode): a ``heterps_pull`` op whose grad op pushes through the table's fused optimizer.

Both paths reach the same table: the table lives in a process-wide registry of ``libheterps_table.so``,
keyed by name, and the op carries the table's name and config string as attributes, so a process that
only runs a program (a PS trainer) creates the identical table on first use (rows start from a hash of
(seed, key), the same in every process).

The libraries are built at install time (``pip install --no-build-isolation .`` or ``python setup.py
build_ext --inplace`` in a checkout) into ``heterps_paddle/_ops``; nothing is compiled at run time.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
from pathlib import Path
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from heterps_paddle import graph_seam, settings
from heterps_paddle.errors import HeterPSError

__all__ = ["SparseTable", "SparseTableError", "sparse_embedding", "load_ops", "ops_library_path", "core_library_path"]

OPTIMIZERS = ("sgd", "adagrad", "adam")
EVICTION_POLICIES = ("lru", "lfu")
STATS_FIELDS = (
    "rows_in_memory",
    "rows_on_ssd",
    "hits",
    "misses",
    "ssd_promotions",
    "evictions",
    "bytes_in_memory",
    "bytes_on_ssd",
    "spill_errors",
    "memory_budget_bytes",
    "capacity_rows",
    "compactions",
    "bytes_ssd_index",
    "rows_lost",
)
CHECKPOINT_SUFFIX = ".htbl"


class SparseTableError(HeterPSError):
    """A bad id, gradient, config or checkpoint, or a failed table operation."""


_lock = threading.Lock()
_core_lib: Optional[ctypes.CDLL] = None
_ops_loaded = False
_name_counter = itertools.count()


def _ops_dir() -> Path:
    override = str(settings.get("HETERPS_OPS_DIR"))
    return Path(override) if override else Path(__file__).resolve().parent.parent / "_ops"


def core_library_path() -> Path:
    return _ops_dir() / "libheterps_table.so"


def ops_library_path() -> Path:
    return _ops_dir() / "heterps_ops.so"


def _not_built(path: Path) -> SparseTableError:
    return SparseTableError(
        f"{path} is missing: the sparse table libraries are built at install time. Install with "
        "`pip install --no-build-isolation .` (Paddle installed first), or in a source checkout run "
        "`python setup.py build_ext --inplace`."
    )


def _core() -> ctypes.CDLL:
    global _core_lib
    if _core_lib is not None:
        return _core_lib
    with _lock:
        if _core_lib is not None:
            return _core_lib
        path = core_library_path()
        if not path.exists():
            raise _not_built(path)
        # RTLD_GLOBAL + loading by absolute path first: the ops library's DT_NEEDED entry for the same soname
        # then resolves to this very copy, so Python and the ops share one table registry.
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        c_char_p, c_size_t, i64p = ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "heterps_last_error": ([], ctypes.c_char_p),
            "heterps_table_open": ([c_char_p, c_char_p], ctypes.c_int),
            "heterps_table_drop": ([c_char_p], ctypes.c_int),
            "heterps_table_dim": ([c_char_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_pull": ([c_char_p, i64p, c_size_t, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_push": ([c_char_p, i64p, c_size_t, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_peek": ([c_char_p, i64p, c_size_t, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_assign": ([c_char_p, i64p, c_size_t, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_take_rows": ([c_char_p, i64p, c_size_t, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_put_rows": ([c_char_p, i64p, c_size_t, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_save": ([c_char_p, c_char_p], ctypes.c_int),
            "heterps_table_load": ([c_char_p, c_char_p], ctypes.c_int),
            "heterps_table_stats": ([c_char_p, ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
            "heterps_table_clear": ([c_char_p], ctypes.c_int),
            "heterps_table_config": ([c_char_p, ctypes.c_char_p, c_size_t], ctypes.c_int),
            "heterps_table_lost": ([c_char_p, ctypes.c_void_p, c_size_t, ctypes.c_void_p], ctypes.c_int),
            "heterps_table_forget_lost": ([c_char_p, ctypes.c_void_p], ctypes.c_int),
            "heterps_inject_write_failure_after": ([ctypes.c_int64], None),
        }
        for fname, (args, res) in sigs.items():
            fn = getattr(lib, fname)
            fn.argtypes = args
            fn.restype = res
        _core_lib = lib
        return lib


def _check(rc: int) -> None:
    if rc != 0:
        raise SparseTableError(_core().heterps_last_error().decode("utf-8", "replace"))


def load_ops() -> None:
    """Register the Paddle ops in this process (idempotent).  Every process that builds or runs a program
    using ``sparse_embedding`` must call this (``sparse_embedding`` does) before the program runs."""
    global _ops_loaded
    if _ops_loaded:
        return
    _core()
    with _lock:
        if _ops_loaded:
            return
        path = ops_library_path()
        if not path.exists():
            raise _not_built(path)
        # lazy: this module stays importable without Paddle (the ctypes face needs none)
        import paddle  # noqa: F401  (libpaddle.so must be loaded before the ops library)
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

        # Registering the same op library twice aborts the process: hence the module-level guard.
        load_op_meta_info_and_register_op(str(path))
        _ops_loaded = True


def gpu_call(fname: str, name: bytes) -> None:
    """On a GPU build, the device copy of a table (made by the ops for GPU tensors) keeps its hot rows in
    device memory; its host tier is this process's CPU table of the same name.  flush moves every device
    row to the host table (before save), drop forgets the device copy (after load)."""
    if not _ops_loaded:
        return
    lib = ctypes.CDLL(str(ops_library_path()))  # already loaded by Paddle: the same handle
    fn = getattr(lib, fname, None)
    if fn is None:  # CPU build: no CUDA table compiled in
        return
    fn.argtypes, fn.restype = [ctypes.c_char_p], ctypes.c_int
    if fn(name) != 0:
        lib.heterps_gpu_last_error.restype = ctypes.c_char_p
        msg = lib.heterps_gpu_last_error().decode("utf-8", "replace")
        if "no GPU sparse table" not in msg:
            raise SparseTableError(msg)


def _as_ids(ids: Any) -> npt.NDArray[np.int64]:
    """ids -> contiguous int64 array, with clear errors for values that are not int64."""
    if isinstance(ids, np.ndarray):
        arr = ids
    else:
        if hasattr(ids, "numpy") and callable(ids.numpy):  # a Paddle tensor
            ids = ids.numpy()
        try:
            arr = np.asarray(ids)
        except OverflowError as exc:
            raise SparseTableError(f"ids must fit in int64: {exc}") from None
    if arr.dtype == object:
        try:
            arr = np.asarray(arr.tolist(), dtype=np.int64)
        except (OverflowError, TypeError, ValueError) as exc:
            raise SparseTableError(f"ids must be integers that fit in int64: {exc}") from None
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise SparseTableError(f"ids must be an integer array, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise SparseTableError(f"ids must fit in int64; the largest is {int(arr.max())}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    if arr.size and (arr == np.iinfo(np.int64).min).any():
        raise SparseTableError("id -2**63 (INT64_MIN) is reserved by the table")
    return arr


class SparseTable:
    """int64 ids -> ``dim`` float32 rows, trained by a fused optimizer, resident in host memory up to
    ``memory_budget_bytes`` (0 = unlimited) with the coldest rows spilled to ``ssd_dir``.

    The table is registered under ``name`` in this process; two objects with the same name share rows.
    """

    def __init__(
        self,
        dim: int,
        optimizer: str = "adagrad",
        lr: float = 0.01,
        *,
        memory_budget_bytes: int = 0,
        ssd_dir: Optional[str] = None,
        seed: int = 0,
        name: Optional[str] = None,
        eviction: str = "lru",
        init_range: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        shards: int = 16,
        grad_clip: float = 0.0,
        host_threads: int = 0,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 4096:
            raise SparseTableError(f"dim must be an integer in [1, 4096], got {dim!r}")
        if optimizer not in OPTIMIZERS:
            raise SparseTableError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        if eviction not in EVICTION_POLICIES:
            raise SparseTableError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        for label, value in (("lr", lr), ("epsilon", epsilon)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SparseTableError(f"{label} must be a finite positive number, got {value!r}")
        if not (isinstance(grad_clip, (int, float)) and math.isfinite(grad_clip) and grad_clip >= 0):
            raise SparseTableError(f"grad_clip must be a finite number >= 0 (0 = off), got {grad_clip!r}")
        if (
            isinstance(host_threads, bool)
            or not isinstance(host_threads, (int, np.integer))
            or not 0 <= host_threads <= 1024
        ):
            raise SparseTableError(
                f"host_threads must be an integer in [0, 1024] (0 = every usable CPU), got {host_threads!r}"
            )
        if not isinstance(memory_budget_bytes, (int, np.integer)) or memory_budget_bytes < 0:
            raise SparseTableError(f"memory_budget_bytes must be an integer >= 0, got {memory_budget_bytes!r}")
        if memory_budget_bytes and not ssd_dir:
            raise SparseTableError("memory_budget_bytes needs ssd_dir: the directory that holds spilled rows")
        if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise SparseTableError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if name is None:
            # Deterministic per creation order, so every process running the same script names tables alike.
            name = f"table_{next(_name_counter)}"
        if not name or any(c in name for c in ";\0"):
            raise SparseTableError(f"invalid table name {name!r}")
        self.name = name
        self.dim = int(dim)
        self.optimizer = optimizer
        self.lr = float(lr)
        self.memory_budget_bytes = int(memory_budget_bytes)
        self.ssd_dir = os.path.abspath(ssd_dir) if ssd_dir else None
        self.seed = int(seed)
        self.eviction = eviction
        parts = [
            f"dim={self.dim}",
            f"optimizer={optimizer}",
            f"lr={float(lr)!r}",
            f"beta1={float(beta1)!r}",
            f"beta2={float(beta2)!r}",
            f"epsilon={float(epsilon)!r}",
            f"init_range={float(init_range)!r}",
            f"seed={self.seed}",
            f"memory_budget_bytes={self.memory_budget_bytes}",
            f"eviction={eviction}",
            f"shards={int(shards)}",
        ]
        if grad_clip:
            parts.append(f"grad_clip={float(grad_clip)!r}")
        if host_threads:  # 0, the default, left out: the config strings of existing programs stay as they were
            parts.append(f"host_threads={int(host_threads)}")
        if self.ssd_dir:
            parts.append(f"ssd_dir={self.ssd_dir}")
        self.config_string = ";".join(parts)
        lib = _core()
        _check(lib.heterps_table_open(self.name.encode(), self.config_string.encode()))
        dim_out, stride_out = ctypes.c_uint32(), ctypes.c_uint32()
        _check(lib.heterps_table_dim(self.name.encode(), ctypes.byref(dim_out), ctypes.byref(stride_out)))
        self.stride = stride_out.value
        self.bname = self.name.encode()  # the table's name as the C API takes it
        self._handles: dict[str, Any] = {}  # Paddle tensors

    def __repr__(self) -> str:
        return f"SparseTable(name={self.name!r}, {self.config_string})"

    # ---- data path ------------------------------------------------------------------------------------
    def pull(self, ids: Any, out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Rows for ``ids`` (any shape) as float32 ``ids.shape + (dim,)``; ``out`` may be given to reuse a
        buffer (C-contiguous float32 of that shape)."""
        keys = _as_ids(ids)
        shape = keys.shape + (self.dim,)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
            raise SparseTableError(f"out must be a C-contiguous float32 array of shape {shape}")
        _check(_core().heterps_table_pull(self.bname, keys.ctypes.data, keys.size, out.ctypes.data))
        return out

    def push(self, ids: Any, grads: npt.ArrayLike) -> None:
        """Apply the optimizer with ``grads`` (float, shape ``ids.shape + (dim,)`` or ``(len, dim)``).
        Gradients of repeated ids are summed first (then clipped to ``grad_clip`` when set).  The whole batch
        is rejected, no row changed, when a gradient is not finite, when an update would make a weight or
        optimizer state non-finite, or when a spilled row fails its check (see ``lost_ids``)."""
        keys = _as_ids(ids)
        g = np.asarray(grads)
        if not np.issubdtype(g.dtype, np.floating):
            raise SparseTableError(f"grads must be floating point, got dtype {g.dtype}")
        if g.shape not in (keys.shape + (self.dim,), (keys.size, self.dim)):
            raise SparseTableError(f"grads must have shape {keys.shape + (self.dim,)}, got {g.shape}")
        g = np.ascontiguousarray(g, dtype=np.float32)
        _check(_core().heterps_table_push(self.bname, keys.ctypes.data, keys.size, g.ctypes.data))

    def assign(self, ids: Any, rows: npt.ArrayLike) -> None:
        """Set the weights of ``ids`` to ``rows`` (shape ``ids.shape + (dim,)`` or ``(len, dim)``), creating
        missing rows; an existing row keeps its optimizer state.  Used to load rows from an authoritative
        store (the parameter servers, heterps_paddle/runtime/gpu_embedding.py).  Repeated ids: the last row
        wins.  A non-finite value rejects the whole call."""
        keys = _as_ids(ids)
        r = np.asarray(rows)
        if not np.issubdtype(r.dtype, np.floating):
            raise SparseTableError(f"rows must be floating point, got dtype {r.dtype}")
        if r.shape not in (keys.shape + (self.dim,), (keys.size, self.dim)):
            raise SparseTableError(f"rows must have shape {keys.shape + (self.dim,)}, got {r.shape}")
        r = np.ascontiguousarray(r, dtype=np.float32)
        # A GPU build may hold newer rows in device memory: bring them home first, and drop the device copy
        # afterwards so the next op refetches the assigned rows.
        gpu_call("heterps_gpu_table_flush_to_host", self.bname)
        _check(_core().heterps_table_assign(self.bname, keys.ctypes.data, keys.size, r.ctypes.data))
        gpu_call("heterps_gpu_table_drop", self.bname)

    def take_rows(self, ids: Any, out: Optional[npt.NDArray[np.float32]] = None) -> npt.NDArray[np.float32]:
        """Remove the rows of ``ids`` (one dimension) and return them whole: ``(len, stride)`` float32, weights then
        optimizer state; an absent id gives its initial row, a repeated id its row once and then its initial row.
        The host tier's side of a promotion into an upper tier (the GPU table), batched over the shards on
        ``host_threads`` threads.  A bad spilled record takes nothing (the id is lost, see ``lost_ids``).  ``out`` may
        be given to reuse a buffer (C-contiguous float32 of that shape), as a GPU table reuses its staging."""
        keys = _as_ids(ids).reshape(-1)
        shape = (keys.size, self.stride)
        if out is None:
            rows = np.empty(shape, dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
            raise SparseTableError(f"out must be a C-contiguous float32 array of shape {shape}")
        else:
            rows = out
        _check(_core().heterps_table_take_rows(self.bname, keys.ctypes.data, keys.size, rows.ctypes.data))
        return rows

    def put_rows(self, ids: Any, rows: npt.ArrayLike, scores: Optional[npt.ArrayLike] = None) -> None:
        """Insert or overwrite whole rows (``(len, stride)``, as ``take_rows`` gives them) with eviction scores
        (uint32 per row; None: now): the host tier's side of an eviction from an upper tier.  Repeated ids: the
        last row wins."""
        keys = _as_ids(ids).reshape(-1)
        r = np.asarray(rows)
        if not np.issubdtype(r.dtype, np.floating) or r.shape != (keys.size, self.stride):
            raise SparseTableError(
                f"rows must be floating point of shape {(keys.size, self.stride)}, got {r.dtype} {r.shape}"
            )
        r = np.ascontiguousarray(r, dtype=np.float32)
        sc = None
        if scores is not None:
            sc = np.ascontiguousarray(scores, dtype=np.uint32)
            if sc.shape != (keys.size,):
                raise SparseTableError(f"scores must have shape {(keys.size,)}, got {sc.shape}")
        _check(
            _core().heterps_table_put_rows(
                self.bname, keys.ctypes.data, keys.size, r.ctypes.data, None if sc is None else sc.ctypes.data
            )
        )

    def peek(self, ids: Any) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8]]:
        """(rows including optimizer state, where) without creating rows or touching eviction scores;
        ``where`` is 0 missing, 1 in memory, 2 on SSD."""
        keys = _as_ids(ids).reshape(-1)
        rows = np.empty((keys.size, self.stride), dtype=np.float32)
        found = np.empty(keys.size, dtype=np.uint8)
        _check(_core().heterps_table_peek(self.bname, keys.ctypes.data, keys.size, rows.ctypes.data, found.ctypes.data))
        return rows, found

    # ---- persistence ----------------------------------------------------------------------------------
    def checkpoint_path(self, directory: str | os.PathLike[str]) -> str:
        return os.path.join(os.fspath(directory), self.name + CHECKPOINT_SUFFIX)

    def save(self, directory: str | os.PathLike[str]) -> str:
        """Write ``<directory>/<name>.htbl`` atomically (temp file, fsync, rename); returns the path."""
        directory = os.fspath(directory)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise SparseTableError(f"cannot create checkpoint directory {directory!r}: {exc}") from None
        path = self.checkpoint_path(directory)
        gpu_call("heterps_gpu_table_flush_to_host", self.bname)
        _check(_core().heterps_table_save(self.bname, path.encode()))
        return path

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Replace the contents with ``<directory>/<name>.htbl``; a corrupted or truncated file raises
        SparseTableError naming it and leaves the table unchanged."""
        path = self.checkpoint_path(directory)
        if not os.path.exists(path):
            raise SparseTableError(f"no checkpoint for table {self.name!r}: {path} does not exist")
        _check(_core().heterps_table_load(self.bname, path.encode()))
        gpu_call("heterps_gpu_table_drop", self.bname)  # stale device rows: refetched from the host table

    def stats(self) -> dict[str, int]:
        buf = (ctypes.c_uint64 * len(STATS_FIELDS))()
        _check(_core().heterps_table_stats(self.bname, buf, len(STATS_FIELDS)))
        return dict(zip(STATS_FIELDS, (int(v) for v in buf)))

    def lost_ids(self) -> dict[int, str]:
        """Ids dropped because their SSD record failed its check, with what was wrong (file, byte offset,
        why).  The other rows keep serving; a lost id touched again starts from its initial row; ``save``
        refuses while any are listed, until ``forget_lost``."""
        lib = _core()
        needed = ctypes.c_size_t(0)
        _check(lib.heterps_table_lost(self.bname, None, 0, ctypes.byref(needed)))
        while True:
            buf = ctypes.create_string_buffer(needed.value)
            _check(lib.heterps_table_lost(self.bname, buf, len(buf), ctypes.byref(needed)))
            if needed.value <= len(buf):  # else more were lost meanwhile: ask again
                break
        lost = {}
        for line in buf.value.decode("utf-8", "replace").splitlines():
            key, _, why = line.partition("\t")
            lost[int(key)] = why
        return lost

    def forget_lost(self) -> int:
        """Accept the loss of the ids ``lost_ids`` lists (so that ``save`` writes the other rows); returns
        how many there were."""
        n = ctypes.c_uint64(0)
        _check(_core().heterps_table_forget_lost(self.bname, ctypes.byref(n)))
        return n.value

    def __len__(self) -> int:
        s = self.stats()
        return s["rows_in_memory"] + s["rows_on_ssd"]

    def clear(self) -> None:
        _check(_core().heterps_table_clear(self.bname))

    def close(self) -> None:
        """Remove the table from this process's registry (its SSD files go with it once no op holds it)."""
        _check(_core().heterps_table_drop(self.bname))

    # ---- Paddle ---------------------------------------------------------------------------------------
    def handle(self) -> Any:
        """The one-element parameter that makes Paddle's backward keep the push (grad) op; see
        custom_ops/paddle/heterps_ops.cc."""
        import paddle  # lazy: this module stays importable without Paddle (the ctypes face needs none)

        if paddle.in_dynamic_mode():
            h = self._handles.get("dygraph")
            if h is None:
                h = paddle.zeros([1], dtype="float32")
                h.stop_gradient = False
                self._handles["dygraph"] = h
            return h
        program = paddle.static.default_main_program()
        pname = f"heterps_table_handle.{self.name}"
        block = program.global_block()
        if block.has_var(pname):
            return block.var(pname)
        return paddle.static.create_parameter(
            shape=[1], dtype="float32", name=pname, default_initializer=paddle.nn.initializer.Constant(0.0)
        )


def sparse_embedding(input: Any, table: SparseTable) -> Any:
    """Look ``input`` (int64 ids, any shape) up in ``table``: returns float32 ``input.shape + [dim]``.
    In training the gradient flowing back into the result is pushed to the table with its optimizer
    (in place of ``paddle.static.nn.sparse_embedding`` for an embedding that lives in one trainer)."""
    if not isinstance(table, SparseTable):
        raise SparseTableError(f"table must be a SparseTable, got {type(table).__name__}")
    load_ops()
    # lazy: this module stays importable without Paddle (the ctypes face needs none)
    import paddle
    from paddle.base.layer_helper import LayerHelper

    dtype = input.dtype
    if dtype not in (paddle.int64,) and str(dtype) not in ("paddle.int64", "int64", "VarType.INT64"):
        raise SparseTableError(f"sparse_embedding ids must be int64, got {dtype}; cast with paddle.cast(x, 'int64')")
    handle = table.handle()
    if paddle.in_dynamic_mode():
        outs = graph_seam.run_custom_op("heterps_pull", input, handle, table.name, table.config_string)
        return outs[0]
    helper = LayerHelper("heterps_pull", **locals())
    out = helper.create_variable_for_type_inference(dtype="float32")
    helper.append_op(
        type="heterps_pull",
        inputs={"Ids": [input], "Handle": [handle]},
        outputs={"Out": [out]},
        attrs={"table": table.name, "config": table.config_string},
    )
    if getattr(input, "lod_level", 0):
        # Sequence (LoD) ids give sequence rows, as paddle.static.nn.embedding does, so sequence_pool works:
        # custom ops do not carry LoD, so a lod_reset op copies the ids' LoD onto the rows.
        seq = helper.create_variable_for_type_inference(dtype="float32")
        seq.desc.set_lod_level(input.lod_level)
        helper.append_op(
            type="lod_reset", inputs={"X": [out], "Y": [input]}, outputs={"Out": [seq]}, attrs={"append": False}
        )
        return seq
    return out


def _inject_write_failure_after(n: int) -> None:
    """Test hook: the n-th following low-level write of the core fails with ENOSPC (0 turns it off)."""
    _core().heterps_inject_write_failure_after(int(n))
