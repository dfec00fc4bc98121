"""The one seam over Paddle's internals, in two modules: this one reads and writes Paddle 2.6.2's private state
through small named functions and keeps this process's context; runtime/patches.py replaces Paddle's functions
(every patch, each once per process).  Both sit behind :func:`check_paddle`, a check of Paddle's shape, so another
Paddle fails at ``minimize`` with a message naming what changed, never silently in training.  Paddle's private
methods on its static graph (editing a Program's blocks and ops, reading an optimizer's settings) are behind
heterps_paddle/graph_seam.py, below every package that edits a program.

The modules that may touch Paddle's private attributes are listed once, in pyproject.toml (ruff's SLF001
``per-file-ignores``, checked by .ci/gates.sh), each with its reason; everything else goes through these functions.

Our state is never stored on Paddle's objects: per-process state lives in one :class:`ProcessContext`
(:func:`context`), not in module dictionaries or as attributes of Paddle's programs, runtimes or role makers.  What
the seam writes onto Paddle's objects is state Paddle or the script reads: Paddle's own (a program's ``_fleet_opt``,
the role maker's heter flag, gloo's initialised flag) and the script's ``strategy.heterps`` / ``heterps_configs``
(runtime/patches.py: they are the strategy's, and must survive fleet's copies of it).  Paddle is imported inside
functions: this module stays importable without it (fleet/evaluation.py and the fleet hook import it early), and it
imports no other runtime module.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator

from heterps_paddle.errors import HeterPSError

SUPPORTED_PADDLE = ("2.6.",)
ROLES = {"PSERVER": "server", "HETER_TRAINER": "heter", "TRAINER": "trainer"}
DATASET_OPTIONS = ("thread", "debug", "fetch_list", "fetch_info", "print_period", "fetch_handler")


class PaddleBehaviourChanged(HeterPSError, RuntimeError):
    """The installed Paddle does not look like the 2.6.2 these patches and fixes were written against."""


@dataclass
class DatasetCall:
    """One ``Executor.train_from_dataset`` call; hooks may replace its program, scope and options."""

    executor: Any
    program: Any
    dataset: Any
    scope: Any
    options: dict[str, Any]

    def main_program(self) -> Any:
        import paddle  # lazy: seam must stay importable without Paddle (fleet/evaluation.py, the fleet hook)

        return self.program if self.program is not None else paddle.static.default_main_program()


DatasetHook = Callable[[DatasetCall], ContextManager[None]]


@dataclass
class ProcessContext:
    """What this process knows about its part of the job (one per process)."""

    role: str  # server | trainer | heter | local (not started by paddle.distributed.launch)
    stage: int  # 1 for CPU trainers (and servers), 2.. for heterogeneous trainers
    stage_num: int  # stages launched
    plan: Any = None  # planning.model.Plan this process runs, once minimize chose it
    dataset_hooks: dict[str, DatasetHook] = field(default_factory=dict)
    # asked before the hooks: True for a train_from_dataset call not to run at all (a pass a resumed launch's
    # checkpoint already holds, runtime/launch_checkpoints.py)
    pass_gate: Callable[[DatasetCall], bool] | None = None
    # runs a train_from_dataset call inside the hooks, given the call that runs it as it stands (the launch's
    # data plan pulls a pass shard by shard, runtime/pulled_pass.py); None: the call runs once
    pass_runner: Callable[[DatasetCall, Callable[[DatasetCall], Any]], Any] | None = None
    # around each train_from_dataset Paddle runs inside the hooks: the pass's one, or each call of a pulled pass
    # (the meter counts a call's files exactly once it ends)
    call_hooks: dict[str, DatasetHook] = field(default_factory=dict)
    after_minimize: dict[str, Callable[[Any], None]] = field(default_factory=dict)  # gets fleet's Fleet
    after_stop_worker: dict[str, Callable[[], object]] = field(default_factory=dict)  # results ignored
    heldout: Any = None  # runtime.heldout.HeldOut of a split job
    watchdog: Any = None  # runtime.watchdog.Watchdog of a split job
    first_send: Any = None  # runtime.first_send.FirstSendHold of a stage of a split job that sends forward
    dense_refresh: Any = None  # runtime.dense_refresh.DenseRefresher of the train_from_dataset running now
    # Executor.run of a program this process cannot run as given (the whole model's forward pass on a stage 1
    # CPU trainer): returns the program to run instead
    run_redirect: Callable[[Any, Any, Any], Any] | None = None
    stage_metrics: Any = None  # runtime.stage_metrics.Client of a stage 1 CPU trainer (False: none found)
    # the launch's checkpoint staging directory whose save runtime/launch_checkpoints.py finishes itself, in the
    # background (runtime/saves.py then leaves it alone)
    deferred_save: str | None = None
    # runtime.gpu_embedding.PassSync of each trainer program it rewrote (the program's pass hook finds it here)
    pass_syncs: weakref.WeakKeyDictionary[Any, Any] = field(default_factory=weakref.WeakKeyDictionary)

    @property
    def split(self) -> bool:
        return self.plan is not None and self.plan.num_stages > 1


def _context_from_env(env: Any = None) -> ProcessContext:
    env = os.environ if env is None else env
    role = ROLES.get(env.get("TRAINING_ROLE", ""), "local")
    return ProcessContext(
        role=role, stage=int(env.get("STAGE_ID", "1") or 1), stage_num=int(env.get("STAGE_NUM", "1") or 1)
    )


_context: ProcessContext | None = None


def context() -> ProcessContext:
    global _context
    if _context is None:
        _context = _context_from_env()
    return _context


def reset_context(env: Any = None) -> ProcessContext:
    """A fresh context (tests that build several jobs' programs in one process)."""
    global _context
    _context = _context_from_env(env)
    return _context


def identity(ctx: ProcessContext | None = None) -> str:
    """This process in words, for log lines that name who failed."""
    ctx = ctx or context()
    endpoint = f"{os.environ.get('POD_IP', '?')}:{os.environ.get('PADDLE_PORT', '?')}"
    if ctx.role == "heter":
        return f"stage {ctx.stage} heterogeneous trainer {endpoint} (pid {os.getpid()})"
    if ctx.role == "server":
        return f"parameter server {endpoint} (pid {os.getpid()})"
    return f"stage 1 CPU trainer {os.environ.get('PADDLE_TRAINER_ID', '?')} {endpoint} (pid {os.getpid()})"


# ---------------------------------------------------------------------------------------------------- checks


def _require(ok: bool, what: str, problems: list[str]) -> None:
    if not ok:
        problems.append(what)


def parameter_names(fn: Any) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def paddle_shape_problems() -> list[str]:
    """What differs from the Paddle 2.6.2 this seam patches (empty when nothing does)."""
    # lazy: seam must stay importable without Paddle (fleet/evaluation.py and the fleet hook import it early)
    import paddle
    from paddle.distributed.fleet.fleet import Fleet
    from paddle.distributed.ps import the_one_ps
    from paddle.distributed.ps.utils import ps_factory

    problems: list[str] = []
    _require(
        paddle.__version__.startswith(SUPPORTED_PADDLE),
        f"paddle {paddle.__version__} (heterps-paddle supports {', '.join(v + 'x' for v in SUPPORTED_PADDLE)})",
        problems,
    )
    _require(
        hasattr(ps_factory, "HeterAsyncPsProgramBuilder"),
        "paddle.distributed.ps.utils.ps_factory has no HeterAsyncPsProgramBuilder",
        problems,
    )
    _require(
        parameter_names(paddle.static.Executor.train_from_dataset)
        == ["self", "program", "dataset", "scope", *DATASET_OPTIONS],
        f"Executor.train_from_dataset{parameter_names(paddle.static.Executor.train_from_dataset)}",
        problems,
    )
    _require(
        parameter_names(Fleet._minimize_impl)[:2] == ["self", "loss"], "Fleet._minimize_impl(self, loss, ...)", problems
    )
    runtime = getattr(the_one_ps, "TheOnePSRuntime", None)
    _require(
        runtime is not None and parameter_names(runtime._stop_worker) == ["self"],
        "paddle.distributed.ps.the_one_ps.TheOnePSRuntime._stop_worker(self)",
        problems,
    )
    return problems


def check_paddle() -> None:
    problems = paddle_shape_problems()
    if problems:
        raise PaddleBehaviourChanged("heterps-paddle cannot run on this Paddle: " + "; ".join(problems))


@contextlib.contextmanager
def no_hook(call: DatasetCall) -> Iterator[None]:
    """A dataset hook that does nothing (what a hook yields when the call is not its business)."""
    yield


# ---------------------------------------------------------------------------- Paddle's private state, read and written


def fleet_runtime() -> Any:
    """Fleet's parameter-server runtime (TheOnePSRuntime), which fleet creates at the end of minimize."""
    from paddle.distributed import fleet  # lazy: seam must stay importable without Paddle

    runtime = fleet.fleet._runtime_handle
    if runtime is None:
        raise PaddleBehaviourChanged("fleet has no parameter-server runtime after minimize")
    return runtime


def origin_program(runtime: Any) -> Any:
    """The program the PS runtime was built from (the whole model, before the split): what fleet's saves save."""
    programs = getattr(runtime, "origin_main_programs", None)
    if not programs:
        raise PaddleBehaviourChanged("fleet's parameter-server runtime has no origin_main_programs")
    return programs[0]


def worker_client(runtime: Any) -> Any:
    """The PS runtime's brpc client to the servers (``fleet.Communicator``'s worker: pull_dense_params,
    client_flush, stop_worker)."""
    return runtime._worker


def server_service(runtime: Any) -> Any:
    """A server's own table service (``load_sparse`` loads any of its tables, dense ones too)."""
    return runtime._server


def sparse_table_layout(runtime: Any) -> dict[int, tuple[str, int]]:
    """This process's sparse tables as the PS runtime built them (a server's at ``init_server``, a trainer's at
    ``init_worker``; empty before): table id -> (name, shard_num), read from the built protos, so that Paddle's
    own default (1,000 when the strategy sets none) is what it really used."""
    from paddle.distributed.fleet.proto import the_one_ps_pb2  # lazy: seam must stay importable without Paddle

    builder = getattr(runtime, "ps_desc_builder", None)
    if builder is None:
        return {}
    desc = builder.ps_desc
    protos = list(desc.server_param.downpour_server_param.downpour_table_param) or list(
        desc.worker_param.downpour_worker_param.downpour_table_param
    )
    return {
        int(p.table_id): (str(p.common.table_name), int(p.shard_num))
        for p in protos
        if p.type == the_one_ps_pb2.PS_SPARSE_TABLE
    }


def send_contexts(runtime: Any) -> dict[str, Any]:
    """The PS runtime's send contexts (one per table: ``is_sparse()``, ``origin_varnames()``, ``table_id()``),
    built by ``init_worker``."""
    contexts: dict[str, Any] = runtime._send_ctx
    return contexts


def role_maker() -> Any:
    from paddle.distributed import fleet  # lazy: seam must stay importable without Paddle

    return fleet.fleet._role_maker


def server_endpoints(maker: Any) -> list[str]:
    """The parameter servers' endpoints, as the role maker read them from the launch."""
    endpoints: list[str] = maker._get_pserver_endpoints()
    return endpoints


def role_id(maker: Any) -> int:
    """This process's index among the processes of its role (a server's index among the servers)."""
    return int(maker._role_id())


def is_first_worker(maker: Any) -> bool:
    return bool(maker._is_first_worker())


def worker_count_and_index(maker: Any) -> tuple[int, int]:
    """How many CPU trainers the launch has, and this trainer's index among them."""
    return int(maker._worker_num()), int(maker._worker_index())


def is_collective(maker: Any) -> bool:
    """Whether fleet runs a collective job (not a parameter-server one)."""
    return bool(maker._is_collective)


def user_strategy(fleet_obj: Any) -> Any:
    """The DistributedStrategy the script passed to ``fleet.distributed_optimizer``."""
    return fleet_obj._user_defined_strategy


def fleet_strategy_copies() -> list[Any]:
    """Fleet's own copies of the strategy (its context's user-defined and valid strategies), which the PS runtime
    builds its table protos from, rather than from the one the meta optimizers hold."""
    from paddle.distributed import fleet  # lazy: seam must stay importable without Paddle

    fleet_context = getattr(fleet.fleet, "_context", None) or {}
    return [
        s for s in (fleet_context.get("user_defined_strategy"), fleet_context.get("valid_strategy")) if s is not None
    ]


def job_strategies(runtime: Any) -> list[Any]:
    """Every copy of the strategy the PS runtime may build its table protos from (fleet's and the runtime's
    context's), each once: a table setting goes into all of them."""
    found = {id(s): s for s in fleet_strategy_copies()}
    context = getattr(runtime, "context", None)
    if isinstance(context, dict) and context.get("user_defined_strategy") is not None:
        found[id(context["user_defined_strategy"])] = context["user_defined_strategy"]
    return list(found.values())


def sparse_table_config(tables: Any, name: str) -> Any:
    """The entry of sparse table ``name`` in ``tables`` (a strategy's ``sparse_table_configs``), added when the
    script set none: Paddle's PS runtime reads a table's settings from the entry with its name."""
    proto = next((t for t in tables if t.table_name == name), None)
    if proto is None:
        proto = tables.add()
        proto.table_name = name
    return proto


def is_heter_section(program: Any) -> bool:
    """Whether ``program`` is a section of Paddle's heter pipeline (it carries pipeline options)."""
    return getattr(program, "_heter_pipeline_opt", None) is not None


def fleet_opt(program: Any) -> dict[str, Any] | None:
    """The trainer options fleet gives a plain PS program (``_fleet_opt``; fleet scripts read and write it)."""
    options: dict[str, Any] | None = program._fleet_opt
    return options


def set_fleet_opt(program: Any, options: dict[str, Any]) -> None:
    """Give ``program`` Paddle's ``_fleet_opt`` (Paddle's own attribute: its executor and the scripts read it)."""
    program._fleet_opt = options


def leave_heter_mode(maker: Any) -> None:
    """Make this process build and run the plain (unsplit) parameter-server job although heterogeneous trainers
    were launched: Paddle reads the role maker's flag when it builds the programs, the servers' tables and the
    runtime, so every server and CPU trainer must turn it off before the PS optimizer runs."""
    if not hasattr(maker, "_is_heter_parameter_server_mode"):
        raise PaddleBehaviourChanged("fleet's role maker has no _is_heter_parameter_server_mode")
    maker._is_heter_parameter_server_mode = False


def drop_from_gloo(maker: Any) -> None:
    """A heterogeneous trainer is in no gloo world (the launcher's "worker" world is the CPU trainers), but with
    PADDLE_WITH_GLOO=1 gloo reads as initialised and init_worker's barriers fail on the missing worker comm;
    uninitialised, its barriers are no-ops and all_gather returns its input, which is what such a trainer needs."""
    gloo = getattr(maker, "_gloo", None)
    if gloo is not None and getattr(gloo, "_worker_comm", None) is None:
        gloo._is_initialized = False


def paddle_launch_arguments(argv: list[str]) -> Any:
    """Paddle's own reading of ``paddle.distributed.launch`` arguments (its legacy PS launcher's parser)."""
    from paddle.distributed.fleet import launch as paddle_launch  # lazy: `heterps --help` must not import Paddle

    saved = sys.argv
    try:
        sys.argv = ["paddle.distributed.launch", *argv]
        return paddle_launch._parse_args()
    finally:
        sys.argv = saved


def end_process(code: int, message: str) -> None:
    """End this process now (the main thread may be blocked in C++ for good, and a script must not go on)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if message:
        # print, not the logger: the line (HETERPS-FATAL: ...) must reach stdout unprefixed, even when logging
        # is not configured in this process
        print(message, flush=True)
    os._exit(code)


# ---- Paddle's parameter-server launcher (fleet/launch_utils.py: ParameterServerLauncher), as heterps launch's
# supervisor reads it (launch/supervisor.py)


@dataclass(frozen=True)
class LaunchedProcess:
    """One process Paddle's PS launcher started: ``proc`` its ``subprocess.Popen``."""

    role: str  # "worker" (a CPU trainer), "server" or "heter_worker"
    index: int  # within its role
    proc: Any
    log: str | None  # its log file (PADDLE's --log_dir/workerlog.N ...)
    stage: int | None  # a heterogeneous trainer's stage


LAUNCHED_ROLES = ("worker", "server", "heter_worker")


def launched_processes(launcher: Any) -> list[LaunchedProcess]:
    """The processes ``launcher`` has started so far (its ``procs`` by role; ``stage_list`` numbers the heterogeneous
    trainers' stages), CPU trainers first."""
    procs = getattr(launcher, "procs", None) or {}
    stages = getattr(launcher, "stage_list", None) or []
    found = []
    for role in LAUNCHED_ROLES:
        for index, tp in enumerate(procs.get(role, [])):
            stage = getattr(tp, "stage", None)
            if stage is None and role == "heter_worker" and index < len(stages):
                stage = stages[index]
            log = getattr(getattr(tp, "log_fn", None), "name", None)
            found.append(LaunchedProcess(role, index, tp.proc, log, stage if role == "heter_worker" else None))
    return found


def hold_after_last_worker(launcher: Any, hold: Callable[[], None]) -> bool:
    """Make ``launcher``'s wait on its last CPU trainer also run ``hold`` after that trainer ends: Paddle's launcher
    stops its servers and heterogeneous trainers as soon as its trainers have ended.  False when it has none."""
    workers = (getattr(launcher, "procs", None) or {}).get("worker") or []
    if not workers:
        return False
    proc = workers[-1].proc
    wait = proc.wait

    def wait_then_hold(timeout: float | None = None) -> Any:
        code = wait(timeout)
        hold()
        return code

    proc.wait = wait_then_hold
    return True
