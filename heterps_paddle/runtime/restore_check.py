"""What a checkpoint holds, in figures that do not depend on its layout, so that a resume proves what it restored
(docs/checkpoints.md, "Every restore proven").

A checkpoint's files are checked by SHA-256 before a resume, but that says nothing of what the servers hold once they
loaded them: the dense tables regrouped into another plan's layout, the sparse ones re-cut into another shard count
or loaded link by link from an incremental chain, then trainer 0's ``init_worker`` (which must not push its own
initial values over them).  A grow-split-leave job once saved a model scoring below chance, and nothing could say
whether its restores were sound.  So:

- **At capture** (runtime/checkpoint.py, trainer 0, in the background): :func:`contents` of the files the servers
  wrote, in the layout they wrote them (before a split job's dense tables are regrouped), go into the manifest:
  per dense parameter its element count, a digest of its values and one of its optimizer state (the columns after
  the value); per sparse table its row count and a digest of every row (values and optimizer state: each key's
  newest row over an incremental checkpoint's whole chain; runtime/row_digest.py), every row checked to sit in
  the shard file its key maps to.
- **On a resume**, before any batch trains (runtime/launch_checkpoints.py, ``check_restored``): stage 1's trainer 0
  has the servers save what they hold (every row, mode 0: a save that changes nothing on the servers), reads the
  same figures off it in this job's layout, and :func:`compare` refuses any difference, naming the parameter or
  table, the checkpoint and both digests; the other trainers wait for its word.

The figures are of Paddle's own text (a row or an element as the servers print it), which a load and a save give
back unchanged: the values are printed with 6 significant digits, which a float32 holds exactly.

Pure file reading: imports no Paddle.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from heterps_paddle.runtime import row_digest, shard_lines
from heterps_paddle.runtime.checkpoint_files import CheckpointError
from heterps_paddle.runtime.table_shards import shard_files

FORMAT = 2  # of the manifest's contents; an earlier version's (no "format"): sparse rows sampled, their digest unused


@dataclass(frozen=True)
class DenseParameter:
    numel: int
    values: str  # digest of its elements' values, in order
    state: str  # digest of its optimizer's columns, in order


@dataclass(frozen=True)
class SparseTable:
    rows: int
    digest: str | None  # of every row (runtime/row_digest.py); None: captured by an earlier version, rows counted


@dataclass(frozen=True)
class Contents:
    dense: dict[str, DenseParameter]  # by parameter name
    sparse: dict[int, SparseTable]  # by table id

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "dense": {name: vars(p) for name, p in sorted(self.dense.items())},
            "sparse": {f"{table_id:03d}": vars(t) for table_id, t in sorted(self.sparse.items())},
        }

    @staticmethod
    def from_dict(document: Any, where: str) -> Contents:
        try:
            if not isinstance(document, dict):
                raise TypeError(f"a {type(document).__name__}, not a mapping")
            earlier = "format" not in document and "sample_every" in document  # its sparse digests were of samples
            if not earlier and document.get("format") != FORMAT:
                raise ValueError(f"format {document.get('format')!r}, this version reads {FORMAT}")
            dense = {str(name): DenseParameter(**p) for name, p in document["dense"].items()}
            sparse = {
                int(table_id): SparseTable(int(t["rows"]), None if earlier else str(t["digest"]))
                for table_id, t in document["sparse"].items()
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {where}: unreadable contents in its manifest ({exc})") from None
        return Contents(dense, sparse)


def _digest(chunks: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
        h.update(b"\n")
    return h.hexdigest()[:32]


def table_lines(directory: str) -> list[bytes]:
    """A dense table directory's element lines, in order (its servers' parts in their order)."""
    if not os.path.isdir(directory):
        return []
    parts = sorted(os.path.join(directory, f) for f in os.listdir(directory) if f.startswith("part-"))
    return [line.rstrip(b"\n") for path in parts for line in shard_lines.lines(path) if line.strip()]


def parameter_lines(root: str, layout: Sequence[Any]) -> dict[str, list[bytes]]:
    """Each dense parameter's element lines (the value, then its optimizer's columns), read from the tables
    ``layout`` names (``checkpoint.DenseTable``: table_id, names, numels) under ``root``: a checkpoint's regrouping
    and its contents read them so.  A table missing, or holding another count of values, is an error naming it."""
    out: dict[str, list[bytes]] = {}
    for table in layout:
        directory = os.path.join(root, f"{table.table_id:03d}")
        if not os.path.isdir(directory):
            raise CheckpointError(
                f"checkpoint {root}: dense table {table.table_id} ({', '.join(table.names)}) is missing"
            )
        lines = table_lines(directory)
        if len(lines) != sum(table.numels):
            raise CheckpointError(
                f"checkpoint {root}: dense table {table.table_id} has {len(lines)} values, its parameters "
                f"{', '.join(table.names)} have {sum(table.numels)}"
            )
        start = 0
        for name, numel in zip(table.names, table.numels):
            out[name] = lines[start : start + numel]
            start += numel
    return out


def dense_contents(root: str, layout: Sequence[Any]) -> dict[str, DenseParameter]:
    """Each dense parameter of the tables ``layout`` names under ``root``: its values' and its optimizer state's
    digests."""
    out: dict[str, DenseParameter] = {}
    for name, lines in parameter_lines(root, layout).items():
        split = [line.split(b" ", 1) for line in lines]
        out[name] = DenseParameter(
            len(lines),
            _digest(columns[0] for columns in split),
            _digest(columns[1] if len(columns) > 1 else b"" for columns in split),
        )
    return out


def sparse_contents(links: Sequence[str], table_id: int) -> SparseTable:
    """Sparse table ``table_id`` as loading ``links`` in order leaves it (an incremental chain, its base first;
    one directory for a full save): each key's newest row counts once."""
    table = row_digest.table_rows([shard_files(os.path.join(link, f"{table_id:03d}")) for link in links])
    return SparseTable(table.rows, table.digest)


def contents(root: str, layout: Sequence[Any], sparse_ids: Iterable[int], links: Sequence[str] = ()) -> Contents:
    """What the tables under ``root`` hold: its dense tables in ``layout``, its sparse ones (``sparse_ids``) as
    loading ``links`` then ``root`` leaves them."""
    return Contents(
        dense_contents(root, layout),
        {table_id: sparse_contents([*links, root], table_id) for table_id in sparse_ids},
    )


def compare(expected: Contents, actual: Contents, checkpoint: str) -> str:
    """What was compared, in a line, when the servers hold what ``checkpoint`` captured; else a CheckpointError
    naming the first difference (the parameter or table, what differs, both digests)."""

    def refuse(what: str, held: object, captured: object) -> CheckpointError:
        return CheckpointError(
            f"the restore from checkpoint {checkpoint} does not reproduce what it captured: {what}: the servers "
            f"hold {held}, the checkpoint captured {captured}"
        )

    for name in sorted(set(expected.dense) ^ set(actual.dense)):
        there = ("it", "no such parameter")
        raise refuse(f"dense parameter {name}", there[name not in actual.dense], there[name not in expected.dense])
    labels = {"numel": "element count", "values": "values digest", "state": "optimizer state digest"}
    for name, captured in sorted(expected.dense.items()):
        for field, label in labels.items():
            if getattr(actual.dense[name], field) != getattr(captured, field):
                raise refuse(
                    f"dense parameter {name}'s {label}", getattr(actual.dense[name], field), getattr(captured, field)
                )
    compared = [
        f"{len(expected.dense)} dense parameters ({sum(p.numel for p in expected.dense.values())} values and their "
        "optimizer state)"
    ]
    for table_id, table in sorted(expected.sparse.items()):
        held = actual.sparse.get(table_id)
        if held is None:
            raise refuse(f"sparse table {table_id:03d}", "no such table", f"{table.rows} rows")
        if held.rows != table.rows:
            raise refuse(f"sparse table {table_id:03d}'s row count", held.rows, table.rows)
        if table.digest is None:
            compared.append(f"sparse table {table_id:03d} ({table.rows} rows counted: captured by an earlier version)")
            continue
        if held.digest != table.digest:
            raise refuse(
                f"sparse table {table_id:03d}'s rows (their values and optimizer state)", held.digest, table.digest
            )
        compared.append(f"sparse table {table_id:03d} ({table.rows} rows, every row)")
    return "; ".join(compared)
