"""``heterps launch``'s command line, read once, into one typed value that travels whole.

    heterps launch [OPTIONS...] TRAIN.py [SCRIPT ARGS...]

OPTIONS are heterps launch's own and ``python -m paddle.distributed.launch``'s, in any order and in either spelling
(``--name value`` or ``--name=value``); the first word that is not an option is the training script, and everything
after it is the script's own.  An option given twice, an option neither launcher knows, an option without its value
and a training script that is not a Python file are errors naming what was wrong (exit 2), before anything starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from heterps_paddle.errors import EXIT_INPUT_ERROR, HeterPSError
from heterps_paddle.files import real
from heterps_paddle.text_numbers import ascii_float, ascii_int

USAGE = (
    "usage: heterps launch [--timeout S] [--quiet] [--metrics-port P] [--checkpoint-dir DIR [--checkpoint-every N|Nm]] "
    "PADDLE_LAUNCH_ARGS... train.py [ARGS...]\n"
    "(the arguments of python -m paddle.distributed.launch; see `python -m paddle.distributed.launch -h`)\n"
    "   or: heterps launch [--timeout S] [--quiet] [--checkpoint-dir DIR ...] --hosts HOSTS --plan PLAN "
    "[--host ADDR] [--restarts N] [--devices plan|cpu] [--cluster FILE] [--server-num N] "
    "[--join type=TYPE[,units=N][,port=P]] [--adapt off|advise|on] [--on-scale CMD] --log_dir LOG train.py [ARGS...]\n"
    "(across hosts, the same command on every host: docs/across-hosts.md; options in any order before train.py;\n"
    " --join: a machine that is not in the hosts file joins the running job as that)\n"
    "   or: heterps launch --leave --log_dir LOG   (LOG: the --log_dir of the heterps launch running on this host)\n"
    "(asks the job to let that host go: a checkpoint, then the job goes on without it; SIGTERM to its launch does "
    "the same)"
)

# heterps launch's own options (each takes a value) and flags
OWN_VALUED = (
    "--timeout",
    "--checkpoint-dir",
    "--checkpoint-every",
    "--hosts",
    "--plan",
    "--host",
    "--cluster",
    "--server-num",
    "--devices",
    "--restarts",
    "--join",
    "--metrics-port",
    "--adapt",
    "--on-scale",
)
OWN_FLAGS = ("--quiet",)
# Paddle 2.6.2's launcher options (fleet/launch.py: _parse_args), every one of which takes a value; --gpus /
# --selected_gpus and --xpus / --selected_xpus exist on GPU and XPU builds only.  Its --host (elastic mode) is
# heterps launch's own here: this host's address in a launch across hosts.  tests/test_launch_options.py checks
# the list against the installed Paddle's parser.
PADDLE_VALUED = (
    "--log_dir",
    "--backend",
    "--nproc_per_node",
    "--run_mode",
    "--gpus",
    "--selected_gpus",
    "--xpus",
    "--selected_xpus",
    "--ips",
    "--cluster_topo_path",
    "--rank_mapping_path",
    "--enable_auto_mapping",
    "--servers",
    "--workers",
    "--coordinators",
    "--heter_workers",
    "--heter_devices",
    "--worker_num",
    "--coordinator_num",
    "--server_num",
    "--heter_worker_num",
    "--http_port",
    "--elastic_server",
    "--elastic_pre_hook",
    "--job_id",
    "--np",
    "--scale",
    "--force",
)
DEVICES = ("plan", "cpu")
ADAPT_MODES = ("off", "advise", "on")


class OptionsError(HeterPSError, ValueError):
    """A bad ``heterps launch`` command line; the message names the option or word."""

    exit_code = EXIT_INPUT_ERROR


@dataclass(frozen=True)
class HostsOptions:
    """``--hosts HOSTS --plan PLAN ...``: this host's part of a plan across hosts (launch/hosts.py)."""

    hosts: str
    plan: str
    host: str | None = None  # this host's address (default: POD_IP, else the host name's)
    cluster: str | None = None  # default: the one the hosts file names
    server_num: int | None = None
    devices: str = "plan"  # plan: heterogeneous stages on their GPUs; cpu: on CPUs
    restarts: int = 0  # rounds the job may start again after losing a host or a process
    # --join type=TYPE[,units=N][,port=P]: this machine is not in the hosts file and joins the running job as that
    join: Mapping[str, Any] | None = None

    @property
    def may_stand_by(self) -> bool:
        """Whether this host, when a round's plan runs nothing on it, stands by for a later round's (the job may
        start again, or it joins from outside the hosts file) rather than end at once.  The one home of that rule."""
        return self.restarts > 0 or self.join is not None


@dataclass(frozen=True)
class LaunchOptions:
    script: str  # the training script
    script_args: tuple[str, ...] = ()
    paddle: tuple[tuple[str, str], ...] = ()  # Paddle's launcher's options, in the order given
    timeout: float | None = None  # bounds the whole launch (every attempt of a one-host job together)
    quiet: bool = False
    checkpoint_dir: str | None = None
    checkpoint_every: str | None = None
    hosts: HostsOptions | None = None
    metrics_port: int | None = None  # --metrics-port P: the job's figures for Prometheus (launch/metrics_server.py)
    adapt: str = "advise"  # --adapt off|advise|on: the plan follows the job's measurements (docs/adaptive.md)
    on_scale: str | None = None  # --on-scale CMD: run with the units the plan wants and those it let go (JSON)

    def get(self, name: str) -> str | None:
        """A Paddle launcher option's value as given (None: not given)."""
        return dict(self.paddle).get(name)

    @property
    def log_dir(self) -> str:
        return self.get("--log_dir") or "log"

    def with_paddle(self, values: Mapping[str, str] | Iterable[tuple[str, str]]) -> LaunchOptions:
        """These options with Paddle launcher options set: a given one replaced where it stood, a new one added."""
        new = dict(values)
        kept = tuple((name, new.pop(name) if name in new else value) for name, value in self.paddle)
        return replace(self, paddle=kept + tuple(new.items()))

    def launcher_argv(self) -> list[str]:
        """The arguments of ``python -m paddle.distributed.launch``: its options, the script, the script's."""
        options = [f"{name}={value}" for name, value in self.paddle]
        return [*options, self.script, *self.script_args]

    def inputs(self) -> dict[str, str]:
        """The files this launch was given, real path -> what each is: the training script, every argument of it
        that names an existing file (its config, say), and across hosts the plan, the hosts file and the cluster
        file.  No process of the job writes over any of them (files.py: overwritten_input)."""
        found = {real(self.script): "the training script"}
        for arg in self.script_args:
            value = arg.partition("=")[2] if arg.startswith("-") else arg
            if value and os.path.isfile(value):
                found.setdefault(real(value), f"the training script's argument {arg!r}")
        if self.hosts is not None:
            found[real(self.hosts.plan)] = "the plan heterps launch was given (--plan)"
            found[real(self.hosts.hosts)] = "the hosts file (--hosts)"
            if self.hosts.cluster is not None:
                found[real(self.hosts.cluster)] = "the cluster file (--cluster)"
        return found

    def paddle_arguments(self) -> Any:
        """Paddle's own reading of the launcher's arguments (its legacy PS launcher's parser)."""
        from heterps_paddle.runtime import seam

        return seam.paddle_launch_arguments(self.launcher_argv())


@dataclass
class _Given:
    values: dict[str, str] = field(default_factory=dict)
    paddle: list[tuple[str, str]] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)


RETIRED_SLICES = "HETERPS_CHECKPOINT_SLICES"


def parse(argv: list[str]) -> LaunchOptions:
    """``heterps launch``'s arguments (module doc); OptionsError when they are wrong."""
    given = _Given()
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            break
        name, eq, value = arg.partition("=")
        if name in seen:
            raise OptionsError(f"heterps launch: {name} is given twice")
        seen.add(name)
        if name in OWN_FLAGS:
            if eq:
                raise OptionsError(f"heterps launch: {name} takes no value (got {arg!r})")
            given.flags.add(name)
            i += 1
            continue
        if name not in OWN_VALUED and name not in PADDLE_VALUED:
            raise OptionsError(
                f"heterps launch: {name} is not an option of heterps launch nor of paddle.distributed.launch "
                f"(before the training script; the script's own options go after it)\n{USAGE}"
            )
        if not eq:
            if i + 1 >= len(argv):
                raise OptionsError(f"heterps launch: {name} needs a value")
            value, i = argv[i + 1], i + 1
        i += 1
        if name in OWN_VALUED:
            given.values[name] = value
        else:
            given.paddle.append((name, value))
    if i >= len(argv):
        raise OptionsError(f"heterps launch: no training script given\n{USAGE}")
    if os.environ.get(RETIRED_SLICES):
        # retired, not ignored: a user who set it expects its checkpoints inside a pass, which come another way now
        raise OptionsError(
            f"heterps launch: {RETIRED_SLICES} is retired: every pass is pulled from the job's data plan, shard by "
            "shard, and a checkpoint inside a pass comes between two shards without it (docs/data-plan.md); unset it"
        )
    script = argv[i]
    _check_script(script)
    values = given.values
    return LaunchOptions(
        script=script,
        script_args=tuple(argv[i + 1 :]),
        paddle=tuple(given.paddle),
        timeout=_seconds(values["--timeout"]) if "--timeout" in values else None,
        quiet="--quiet" in given.flags,
        checkpoint_dir=values.get("--checkpoint-dir"),
        checkpoint_every=values.get("--checkpoint-every"),
        hosts=_hosts_options(values),
        metrics_port=_port("--metrics-port", values["--metrics-port"]) if "--metrics-port" in values else None,
        adapt=_adapt(values.get("--adapt", "advise")),
        on_scale=values.get("--on-scale") or None,
    )


def _check_script(script: str) -> None:
    if not script.endswith(".py"):
        raise OptionsError(
            f"heterps launch: the training script {script!r} is not a Python script (.py): the first word that is "
            "not an option is the script, so an option's value may be missing before it"
        )
    if not os.path.isfile(script):
        raise OptionsError(f"heterps launch: the training script {script!r} does not exist (or is not a file)")


def _hosts_options(values: Mapping[str, str]) -> HostsOptions | None:
    names = ("--hosts", "--plan", "--host", "--cluster", "--server-num", "--devices", "--restarts", "--join")
    present = [name for name in names if name in values]
    if not present:
        return None
    missing = [name for name in ("--hosts", "--plan") if name not in values]
    if missing:
        raise OptionsError(f"heterps launch: {', '.join(present)} across hosts needs {' and '.join(missing)}")
    devices = values.get("--devices", "plan")
    if devices not in DEVICES:
        raise OptionsError(f"heterps launch: --devices must be plan or cpu, got {devices!r}")
    restarts = _count("--restarts", values.get("--restarts", "0"))
    server_num = _count("--server-num", values["--server-num"]) if "--server-num" in values else None
    return HostsOptions(
        hosts=values["--hosts"],
        plan=values["--plan"],
        host=values.get("--host"),
        cluster=values.get("--cluster"),
        server_num=server_num,
        devices=devices,
        restarts=restarts,
        join=_join(values["--join"]) if "--join" in values else None,
    )


def _join(text: str) -> dict[str, Any]:
    """``--join type=TYPE[,units=N][,port=P]``: what this machine from outside the hosts file is."""
    spec: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or key not in ("type", "units", "port") or key in spec or not value:
            raise OptionsError(
                f"heterps launch: --join {text!r}: expected type=TYPE[,units=N][,port=P] (bad item {item!r})"
            )
        spec[key] = value if key == "type" else _count(f"--join {key}", value)
    if "type" not in spec:
        raise OptionsError(f"heterps launch: --join {text!r} needs type=TYPE (a resource type of the cluster)")
    return spec


def _count(name: str, text: str) -> int:
    try:
        value = ascii_int(text)  # not int(): it reads "٣" and "1_000" (heterps_paddle/text_numbers.py)
    except ValueError:
        raise OptionsError(f"heterps launch: {name}: {text!r} is not a number") from None
    if value < 0:
        raise OptionsError(f"heterps launch: {name} must be >= 0, got {value}")
    return value


def _adapt(text: str) -> str:
    if text not in ADAPT_MODES:
        raise OptionsError(f"heterps launch: --adapt must be one of {', '.join(ADAPT_MODES)}, got {text!r}")
    return text


def _port(name: str, text: str) -> int:
    value = _count(name, text)
    if not 1 <= value <= 65535:
        raise OptionsError(f"heterps launch: {name} must be a port number (1..65535), got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = ascii_float(text)
    except ValueError:
        raise OptionsError(f"heterps launch: --timeout: {text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise OptionsError(f"heterps launch: --timeout must be a positive number of seconds, got {text!r}")
    return value
