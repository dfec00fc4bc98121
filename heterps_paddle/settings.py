"""Every ``HETERPS_*`` environment variable the package reads at run time: its meaning and default, in one place.

Read them through :func:`get` (typed, checked: a bad value is an error naming the variable), never with
``os.environ`` elsewhere.  Build-time variables (``HETERPS_BUILD_OPS``, ``HETERPS_BUILD_JOBS``, ``HETERPS_PADDLE``,
``HETERPS_CUDA``...) belong to ``setup.py`` and CMake and are listed in docs/sparse-table.md.

Pure Python, no Paddle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from heterps_paddle.errors import HeterPSError


class SettingError(HeterPSError, ValueError):
    """A HETERPS_* environment variable with a value that cannot be used."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    parse: Callable[[str], object] = str


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be positive")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError("must be 0 or more")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError("must be between 0 and 1")
    return value


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return text == "1"


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _positive_count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be 1 or more")
    return value


def _shards(text: str) -> int | None:
    """Unset: None (the launch chooses: runtime/table_shards.py); else a count of at least 1."""
    if not text.strip():
        return None
    value = int(text)
    if value < 1:
        raise ValueError("must be 1 or more (or unset: the launch chooses)")
    return value


def _range_bytes(text: str) -> int:
    """0 (no file is cut) or a range's bytes of at least a page: data_plan/bounds.py's MIN_RANGE_BYTES, restated
    here because settings sits below the data plan in the import layers (tests/test_range_feed_unit.py holds the
    two equal)."""
    value = int(text)
    if value != 0 and value < 4096:
        raise ValueError("must be 0 (files are not cut) or 4096 or more")
    return value


def _staging(text: str) -> str:
    """``memory`` (the default), ``disk``, or an absolute directory (runtime/checkpoint_persist.staging_for)."""
    if text in ("memory", "disk") or os.path.isabs(text):
        return text
    raise ValueError("must be memory, disk or an absolute directory")


def checkpoint_every(text: str) -> tuple[float, str]:
    """``N`` (passes of train_from_dataset, a positive integer) or ``Nm`` (minutes) -> (N, "passes" | "minutes")."""
    text = text.strip()
    if text.endswith("m"):
        minutes = float(text[:-1])
        if not minutes > 0:
            raise ValueError("minutes must be positive")
        return minutes, "minutes"
    if not text.isdigit() or int(text) < 1:
        raise ValueError("must be a positive number of passes (N) or of minutes (Nm, e.g. 10m)")
    return float(int(text)), "passes"


_ALL = (
    Setting(
        "HETERPS_CACHE",
        os.path.join(os.path.expanduser("~"), ".cache", "heterps"),
        "where generated data, converted data and measurements (profiles, this machine's figures, the "
        "servers' cost per row) are cached",
    ),
    Setting(
        "HETERPS_LAUNCH",
        "",
        "set by `heterps launch` for every process of the job: its launch arguments as JSON (Paddle's "
        "launcher tells a process only its own stage's device)",
    ),
    Setting(
        "HETERPS_LAUNCH_TIMEOUT",
        "",
        "set by `heterps launch --timeout S` for the process that runs Paddle's launcher: seconds the job may take",
    ),
    Setting(
        "HETERPS_SHARED_OUTPUT_DIR",
        "0",
        "1: heterps_configs['output_dir'] is storage every host of a multi-host launch shares, so one plan "
        "can be made there for all",
        _flag,
    ),
    Setting(
        "HETERPS_MEASURE_WAIT_S",
        "300",
        "how long stage 1's trainer 0 of a launch across hosts waits for each host type's timing before it plans "
        "(a type not timed by then is planned on the cluster file's figures, said in the plan report)",
        _positive_float,
    ),
    Setting(
        "HETERPS_PLAN_WAIT_S",
        "900",
        "how long a parameter server waits for the plan a trainer of its launch makes",
        _positive_float,
    ),
    Setting(
        "HETERPS_STARTUP_TIMEOUT",
        "120",
        "seconds a process of a split job waits for a peer it depends on to come up; and a launch across hosts "
        "(heterps launch --hosts) for every host to join",
        _positive_float,
    ),
    Setting(
        "HETERPS_HOST_TIMEOUT",
        "30",
        "seconds a launch across hosts (heterps launch --hosts) waits without a word from a host, or from its "
        "coordinator, before it counts that host as lost",
        _positive_float,
    ),
    Setting(
        "HETERPS_LEAVE_GRACE_S",
        "90",
        "seconds a host that asked to leave a launch across hosts (SIGTERM to its heterps launch, heterps launch "
        "--leave) gives the job for a checkpoint once the trainers have trained the shards in hand; past it the job goes on "
        "without the host from the newest checkpoint.  Below the notice the platform gives (about 120 s on the big "
        "clouds' spot VMs, 30 s on some: set it lower there)",
        _positive_float,
    ),
    Setting(
        "HETERPS_CONNECT_RETRIES",
        "2",
        "times a launch starts its job again when Paddle's HeterClient aborted a process on brpc's fixed 200 ms "
        "connect timeout, the first thing to go wrong (launch/paddle_aborts.py); give every host of a launch across "
        "hosts the same value; 0: never",
        _count,
    ),
    Setting("HETERPS_WATCHDOG", "1", "0: no peer watchdog in the processes of a split job", _flag),
    Setting(
        "HETERPS_STOP_WAIT_S",
        "60",
        "seconds a CPU trainer's stop_worker waits for the heterogeneous trainers to finish serving",
        _positive_float,
    ),
    Setting(
        "HETERPS_STOP_GRACE_S",
        "1.5",
        "seconds more after their ports closed (they stop their own clients and exit)",
        _positive_float,
    ),
    Setting(
        "HETERPS_DENSE_REFRESH",
        "pull",
        "how a heterogeneous section's dense parameters come back from the servers: 'pull' (a thread pulls "
        "every HETERPS_DENSE_PULL_MS) or 'communicator' (Communicator::Send and its recv thread)",
        _choice("pull", "communicator"),
    ),
    Setting("HETERPS_DENSE_PULL_MS", "20", "period of the dense pull thread, milliseconds", _positive_float),
    Setting(
        "HETERPS_HETER_PRINT_PERIOD",
        "20",
        "batches between the loss/AUC lines a taken-over last-stage trainer prints",
        lambda t: int(t),
    ),
    Setting(
        "HETERPS_FLUSH_TIMEOUT",
        "30",
        "seconds a save or checkpoint keeps flushing a process's PS client while its push queues still hold pushes "
        "(then it warns and goes on: runtime/push_queues.py)",
        _positive_float,
    ),
    Setting(
        "HETERPS_PASS_SYNC_TIMEOUT",
        "3600",
        "seconds a GPU-stage unit waits for the others at a pass barrier",
        _positive_float,
    ),
    Setting(
        "HETERPS_CHECKPOINT_DIR",
        "",
        "set by `heterps launch --checkpoint-dir DIR` for every process: where the launch's checkpoints are kept "
        "(DIR/pass-NNNNNN) and resumed from (docs/checkpoints.md)",
    ),
    Setting(
        "HETERPS_CHECKPOINT_EVERY",
        "1",
        "set by `heterps launch --checkpoint-every`: a checkpoint after every N passes of train_from_dataset (N), "
        "or after the first pass that ends N minutes after the last checkpoint (Nm)",
        checkpoint_every,
    ),
    Setting(
        "HETERPS_CHECKPOINT_BASE_EVERY",
        "1",
        "with `heterps launch --checkpoint-dir`: every Nth checkpoint is a full base, the ones between are incremental "
        "(the sparse rows pushed since the previous checkpoint, the dense tables in full); 0 or 1: every checkpoint "
        "full (docs/checkpoints.md, 'Incremental checkpoints')",
        _count,
    ),
    Setting(
        "HETERPS_TABLE_SHARDS",
        "",
        "with `heterps launch --checkpoint-dir`: the shard files each sparse table is saved in, for the whole job "
        "(Paddle's server opens each with a shell of its own: 1,000 by default made most of a checkpoint's pause); "
        "unset: the checkpoint resumed from's count, else 24 a server (what keeps Paddle's 24 table threads a "
        "server busy); a number: that count (docs/checkpoints.md, 'Shard files')",
        _shards,
    ),
    Setting(
        "HETERPS_CHECKPOINT_RESUME",
        "",
        "set by `heterps launch --checkpoint-dir` for every process: the checkpoint the launch resumes from, or "
        "'none' (start fresh); unset, each process chooses from HETERPS_CHECKPOINT_DIR itself",
    ),
    Setting(
        "HETERPS_CHECKPOINT_STAGING",
        "memory",
        "where the servers write a checkpoint while the trainers pause: 'memory' (shared memory, when it has room "
        "for twice the last checkpoint and every server is on trainer 0's host; on disk otherwise), 'disk' (beside "
        "HETERPS_CHECKPOINT_DIR), or an absolute directory; the rest of the checkpoint is made in the background "
        "(docs/checkpoints.md, 'The pause')",
        _staging,
    ),
    Setting(
        "HETERPS_DATA_PLAN",
        "pull",
        "how the stage 1 CPU trainers of heterps launch share a pass's files: pull (each takes the next file of the "
        "pass's union when it is ready for one, docs/data-plan.md) or static (each trains the files its script gave "
        "it: a benchmark's baseline)",
        _choice("pull", "static"),
    ),
    Setting(
        "HETERPS_RANGE_BYTES",
        str(256 << 20),
        "a pulled pass's local, uncompressed file larger than this is cut into byte ranges of it, each a shard "
        "(runtime/range_feed.py; docs/data-plan.md); 0: files are never cut",
        _range_bytes,
    ),
    Setting(
        "HETERPS_CHECKPOINT_WAIT_S",
        "3600",
        "seconds a CPU trainer waits for the others at a checkpoint's barrier (and for trainer 0's save)",
        _positive_float,
    ),
    Setting(
        "HETERPS_METER_S",
        "5",
        "seconds between a trainer's measurements of its samples and CPU time (runtime/meter.py; docs/metrics.md)",
        _positive_float,
    ),
    Setting("HETERPS_METER", "1", "0: the job's processes measure nothing (no rates, no measured cost)", _flag),
    Setting(
        "HETERPS_RATES_WINDOW_S",
        "30",
        "the moving window a stage's measured samples/s and work share are taken over, seconds (launch/gauge.py)",
        _positive_float,
    ),
    Setting(
        "HETERPS_STRAGGLER_SHARE",
        "0.6",
        "a stage 1 trainer training under this share of its peers' median samples/s in the same pass is named slow "
        "on the console and in the rates (launch/gauge.py)",
        _share,
    ),
    Setting(
        "HETERPS_STATUS_EVERY_S",
        "60",
        "seconds between the console's lines of measured rates and cost (launch/gauge.py)",
        _positive_float,
    ),
    Setting(
        "HETERPS_ADAPT_MISS",
        "0.10",
        "--adapt: the target counts as missed when every rates of HETERPS_ADAPT_SUSTAIN_S is under it by more than this share",
        _positive_float,
    ),
    Setting("HETERPS_ADAPT_SUSTAIN_S", "45", "--adapt: how long a miss must last before it counts", _positive_float),
    Setting(
        "HETERPS_ADAPT_SAVING",
        "0.15",
        "--adapt: a plan meeting the target is worth a move when it costs at least this share less",
        _positive_float,
    ),
    Setting(
        "HETERPS_ADAPT_FASTER",
        "0.15",
        "--adapt: under a budget, a plan within it is worth a move when it is at least this share faster",
        _positive_float,
    ),
    Setting(
        "HETERPS_ADAPT_EVERY_S", "30", "--adapt: seconds between two reconsiderations of the plan", _positive_float
    ),
    Setting("HETERPS_ADAPT_COOLDOWN", "2", "--adapt: checkpoints after a move before another, but for a miss", _count),
    Setting(
        "HETERPS_ADAPT_MOVE_S",
        "60",
        "--adapt: what a move costs the job in seconds (checkpoint, restart, restore), weighed against its saving",
        _positive_float,
    ),
    Setting(
        "HETERPS_ADAPT_HORIZON_S",
        "0",
        "--adapt: how long the job is expected to run on, seconds (0: as long again as it has run)",
        _non_negative_float,
    ),
    Setting(
        "HETERPS_ADAPT_STRAGGLER_WINDOWS",
        "3",
        "--adapt: a host whose trainers were slow against their peers (HETERPS_STRAGGLER_SHARE) in this many "
        "comparisons in a row, while the job missed its target, is replaced",
        _positive_count,
    ),
    Setting("HETERPS_OPS_DIR", "", "directory of the sparse-table libraries to load instead of the installed ones"),
    Setting("HETERPS_SLOW_TESTS", "0", "1: run the timing-sensitive tests too", _flag),
)

SETTINGS: Mapping[str, Setting] = {s.name: s for s in _ALL}


def get(name: str, env: Mapping[str, str] | None = None) -> object:
    """The typed value of setting ``name`` (its default when unset or empty)."""
    setting = SETTINGS[name]
    env = os.environ if env is None else env
    text = env.get(name) or setting.default
    try:
        return setting.parse(text)
    except ValueError as exc:
        raise SettingError(f"{name}={text!r}: {exc} ({setting.meaning})") from None


def describe() -> str:
    """Every setting with its default and meaning (``heterps settings``)."""
    return "\n".join(f"{s.name} (default {s.default!r}): {s.meaning}" for s in _ALL)
