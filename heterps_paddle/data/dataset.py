"""From slot-format files to a Paddle dataset for ``train_from_dataset``.

- ``ensure_generated``: the built-in data set, generated once into a cache directory (several worker
  processes may ask at once: a file lock makes one generate while the others wait).
- ``prepare_multislot``: validate and convert slot-format files to MultiSlot text, cached by the source
  file's path, size and modification time (same lock).
- ``make_dataset``: a ``QueueDataset`` / ``InMemoryDataset`` reading the converted files with ``cat``.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

import paddle

from heterps_paddle import settings
from heterps_paddle.data.criteo import READER_RULES, ReadReport, convert_file
from heterps_paddle.data.generator import GeneratedDataset, generate, load_meta
from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import locked, write_atomic
from heterps_paddle.log import configure as configure_logging
from heterps_paddle.log import logger


def cache_dir() -> str:
    return str(settings.get("HETERPS_CACHE"))


def ensure_generated(rows: int, seed: int, root: str | None = None) -> GeneratedDataset:
    """The generated data set of ``rows`` rows and ``seed`` under the cache, generating it if absent."""
    root = root or os.path.join(cache_dir(), "data")
    out_dir = os.path.join(root, f"criteo_synth_rows{rows}_seed{seed}")
    with locked(root):
        meta = load_meta(out_dir)
        if meta is None:
            configure_logging()  # this can run before fleet's minimize configures it: the line must reach the log
            logger.info("generating %s rows (seed %s) into %s", rows, seed, out_dir)
            meta = generate(out_dir, rows, seed)
    return meta


def _conversion_key(path: str, skip_malformed: bool) -> str:
    st = os.stat(path)
    ident = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{int(skip_malformed)}|{READER_RULES}"
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


def prepare_multislot(
    files: Sequence[str], skip_malformed: bool = False, root: str | None = None
) -> tuple[list[str], ReadReport]:
    """Converted MultiSlot files for ``files`` (converting those not yet in the cache) and a report of
    rows read and malformed lines skipped.  A malformed line raises DataFormatError unless
    ``skip_malformed``."""
    root = root or os.path.join(cache_dir(), "multislot")
    report = ReadReport()
    converted = []
    with locked(root):
        for src in files:
            key = _conversion_key(src, skip_malformed)
            dst = os.path.join(root, f"{key}-{os.path.basename(src)}")
            report_path = dst + ".report.json"
            if os.path.isfile(dst) and os.path.isfile(report_path):
                with open(report_path, encoding="utf-8") as f:
                    cached = json.load(f)
                part = ReadReport(rows=cached["rows"], skipped=cached["skipped"], first_errors=cached["first_errors"])
                part.reasons.update(cached["reasons"])
            else:
                part = convert_file(src, dst, skip_malformed)
                write_atomic(
                    report_path,
                    json.dumps(
                        {
                            "rows": part.rows,
                            "skipped": part.skipped,
                            "reasons": dict(part.reasons),
                            "first_errors": part.first_errors,
                        }
                    ),
                )
            report.merge(part)
            converted.append(dst)
    return converted, report


def make_dataset(
    feed_vars: Sequence[Any], files: Sequence[str], batch_size: int, thread_num: int = 1, in_memory: bool = False
) -> Any:
    """A Paddle dataset over converted MultiSlot files (``prepare_multislot``)."""
    if not files:
        raise ValueError("make_dataset: no files to read (does this worker have a shard of the data?)")
    dataset = paddle.distributed.InMemoryDataset() if in_memory else paddle.distributed.QueueDataset()
    dataset.init(batch_size=batch_size, thread_num=thread_num, pipe_command="cat", use_var=list(feed_vars))
    dataset.set_filelist(list(files))
    if in_memory:
        dataset.load_into_memory()
    return dataset


class NotEnoughFiles(HeterPSError):
    pass


def shard(files: Sequence[str], index: int, count: int) -> list[str]:
    """This worker's files, round-robin.  Every worker computes the same check, so with fewer files
    than workers they all stop with the same error instead of one idling while the others wait."""
    if count <= 0 or not 0 <= index < count:
        raise ValueError(f"bad shard {index} of {count}")
    if len(files) < count:
        raise NotEnoughFiles(
            f"{len(files)} data file(s) for {count} workers: every worker needs at least one "
            f"file; split the data into more files (first: {files[0] if files else 'none'})"
        )
    return list(files)[index::count]
