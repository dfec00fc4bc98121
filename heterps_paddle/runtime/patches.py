"""The patches heterps-paddle applies to Paddle 2.6.2 (each once per process), behind runtime/seam.py's check of
Paddle's shape, so another Paddle fails at ``minimize`` (or at import, for the fleet surface) with a message naming
what changed, never silently in training.  The other half of the seam, runtime/seam.py, reads and writes Paddle's
private state through named functions and keeps this process's context; this module replaces Paddle's functions:

- fleet surface, when ``paddle.distributed.fleet`` is imported (:func:`install_fleet_surface`):
  ``DistributedStrategy.heterps`` / ``heterps_configs`` (properties: fleet's ``__setattr__`` accepts only names
  ``hasattr`` knows), the meta optimizer factory's list of names (fleet instantiates meta optimizers by name), and
  ``Fleet.distributed_optimizer`` (with ``strategy.heterps = True`` it applies the runtime patches: they must be in
  place before ``minimize`` starts, since one of them acts when fleet's minimize ends);
- runtime, from ``fleet.distributed_optimizer`` with ``strategy.heterps = True`` (:func:`install`):
  ``ps_factory.HeterAsyncPsProgramBuilder`` -> the fixed builder (runtime/heter_builder.py, Paddle's heter
  pipeline made to work), ``Executor.train_from_dataset`` (one hook: the pieces register context managers
  around it), ``Fleet._minimize_impl`` (actions after fleet's minimize, when fleet's PS runtime exists),
  ``TheOnePSRuntime._stop_worker`` (actions after it), ``Executor.run`` (a hook may replace the program),
  fleet's saves (``TheOnePSRuntime._save_*``) and ``paddle.static.save`` / ``save_inference_model`` (prepared by
  runtime/saves.py), ``TheOnePSRuntime._init_server`` (dense tables restored, runtime/checkpoint.py) and the initial
  dense push of ``init_worker`` (``_init_all_params``, ``Communicator.init_params``: skipped over restored tables);
- the launcher, in ``heterps launch``'s supervised child only, and only while Paddle's launcher runs
  (:func:`supervised_launcher`): ``ParameterServerLauncher.start_ps`` tells the supervisor the launcher it starts,
  and is restored afterwards.

Nothing here imports the modules it installs at module level (heter_builder, saves, checkpoint): they import
runtime/seam.py, never this module, so the runtime package has no import cycle.  Paddle is imported inside
functions: :func:`install_fleet_surface` runs in the middle of ``import paddle.distributed.fleet``, where importing
more of Paddle can re-enter it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from typing import Any, Callable, Iterator

from heterps_paddle.errors import HeterPSError
from heterps_paddle.runtime.seam import (
    DATASET_OPTIONS,
    DatasetCall,
    PaddleBehaviourChanged,
    ProcessContext,
    check_paddle,
    context,
    parameter_names,
)

# --------------------------------------------------------------------------------------------- fleet surface


def install_fleet_surface(
    meta_optimizer_cls: type,
    validate_flag: Callable[[Any], bool],
    validate_configs: Callable[[Any], dict[str, Any]],
) -> None:
    """``strategy.heterps`` / ``strategy.heterps_configs`` and the meta optimizer's registration (idempotent).

    Only modules fleet has loaded by the time its import finishes are touched here."""
    # lazy: this runs in the middle of ``import paddle.distributed.fleet``; only modules fleet has loaded by now
    from paddle.distributed.fleet.base import meta_optimizer_factory
    from paddle.distributed.fleet.base.distributed_strategy import DistributedStrategy
    from paddle.distributed.fleet.fleet import Fleet

    name = meta_optimizer_cls.__name__
    if not hasattr(meta_optimizer_factory, "meta_optimizer_names"):
        raise PaddleBehaviourChanged(
            "paddle.distributed.fleet.base.meta_optimizer_factory has no "
            "meta_optimizer_names: heterps cannot register its meta optimizer"
        )
    # fleet instantiates meta optimizers with globals()[name] of the factory module
    setattr(meta_optimizer_factory, name, meta_optimizer_cls)
    if name not in meta_optimizer_factory.meta_optimizer_names:
        meta_optimizer_factory.meta_optimizer_names.append(name)
    if isinstance(getattr(DistributedStrategy, "heterps", None), property):
        return

    if parameter_names(Fleet.distributed_optimizer)[:3] != ["self", "optimizer", "strategy"]:
        raise PaddleBehaviourChanged(
            f"Fleet.distributed_optimizer{parameter_names(Fleet.distributed_optimizer)}: heterps "
            "expects (self, optimizer, strategy=None)"
        )
    original_distributed_optimizer = Fleet.distributed_optimizer

    def distributed_optimizer(self: Any, optimizer: Any, strategy: Any = None) -> Any:
        result = original_distributed_optimizer(self, optimizer, strategy)
        if getattr(getattr(self, "_user_defined_strategy", None), "heterps", False):
            install()
        else:
            from heterps_paddle import settings  # lazy, as Paddle here (module doc)

            if settings.get("HETERPS_CHECKPOINT_DIR"):
                raise HeterPSError(
                    "heterps launch --checkpoint-dir: this fleet script does not set strategy.heterps = True, so "
                    "nothing would save or resume its checkpoints; set it, or launch without --checkpoint-dir"
                )
        return result

    # (paddle.distributed.fleet.distributed_optimizer looks the method up on the fleet singleton at each call)
    Fleet.distributed_optimizer = distributed_optimizer

    def get_flag(self: Any) -> bool:
        return bool(self.__dict__.get("_heterps_flag", False))

    def set_flag(self: Any, value: Any) -> None:
        object.__setattr__(self, "_heterps_flag", validate_flag(value))

    def get_configs(self: Any) -> dict[str, Any]:
        configs: dict[str, Any] | None = self.__dict__.get("_heterps_configs")
        if configs is None:
            configs = validate_configs({})
            object.__setattr__(self, "_heterps_configs", configs)
        return configs

    def set_configs(self: Any, value: Any) -> None:
        object.__setattr__(self, "_heterps_configs", validate_configs(copy.deepcopy(value)))

    # Stored in the instance dict, which survives fleet's deepcopy of the strategy.
    DistributedStrategy.heterps = property(
        get_flag, set_flag, doc="Let heterps-paddle plan and split this parameter-server job (bool)."
    )
    DistributedStrategy.heterps_configs = property(
        get_configs, set_configs, doc="Options of strategy.heterps; see heterps_paddle.fleet.strategy.CONFIG_KEYS."
    )


def set_heterps_flag(strategy: Any, value: bool) -> None:
    """Fleet's _enable/_disable_strategy: the flag without validation (fleet calls it on copies)."""
    object.__setattr__(strategy, "_heterps_flag", value)


# ------------------------------------------------------------------------------------------- runtime patches

_installed = False


def install() -> ProcessContext:
    """Check Paddle's shape and apply the runtime patches once per process; returns the context."""
    global _installed
    ctx = context()
    if _installed:
        return ctx
    check_paddle()
    # lazy: this module is imported in the middle of ``import paddle.distributed.fleet`` (the fleet surface), and
    # heter_builder imports Paddle's PS passes
    import paddle
    from paddle.distributed.fleet.fleet import Fleet
    from paddle.distributed.ps import the_one_ps
    from paddle.distributed.ps.utils import ps_factory

    from heterps_paddle.runtime import launch_checkpoints, meter, pulled_pass
    from heterps_paddle.runtime.heter_builder import FixedHeterProgramBuilder

    # The factory looks the builder class up in its module globals at build time.
    ps_factory.HeterAsyncPsProgramBuilder = FixedHeterProgramBuilder

    original_tfd = paddle.static.Executor.train_from_dataset

    def train_from_dataset(
        self: Any, program: Any = None, dataset: Any = None, scope: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        ctx = context()
        hooks = list(ctx.dataset_hooks.values())
        if not hooks and not ctx.call_hooks and ctx.pass_gate is None and ctx.pass_runner is None:
            return original_tfd(self, program, dataset, scope, *args, **kwargs)
        options = dict(zip(DATASET_OPTIONS, args))
        options.update(kwargs)
        call = DatasetCall(self, program, dataset, scope, options)
        if ctx.pass_gate is not None and ctx.pass_gate(call):
            return None
        with contextlib.ExitStack() as stack:
            for hook in hooks:
                stack.enter_context(hook(call))
            if ctx.pass_runner is not None:
                return ctx.pass_runner(call, run)
            return run(call)

    def run(call: DatasetCall) -> Any:
        with contextlib.ExitStack() as stack:
            for hook in list(context().call_hooks.values()):
                stack.enter_context(hook(call))
            return original_tfd(call.executor, call.program, call.dataset, call.scope, **call.options)

    paddle.static.Executor.train_from_dataset = train_from_dataset

    original_minimize = Fleet._minimize_impl

    def _minimize_impl(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_minimize(self, loss, *args, **kwargs)
        for action in list(context().after_minimize.values()):
            action(self)
        return result

    Fleet._minimize_impl = _minimize_impl

    original_stop = the_one_ps.TheOnePSRuntime._stop_worker

    def _stop_worker(self: Any) -> None:
        original_stop(self)
        for action in list(context().after_stop_worker.values()):
            action()

    the_one_ps.TheOnePSRuntime._stop_worker = _stop_worker
    _install_run_and_saves(paddle, the_one_ps.TheOnePSRuntime)
    # registered before any other dataset hook (apply_plan's come in minimize): its end runs after theirs
    launch_checkpoints.install(ctx)
    pulled_pass.install(ctx)  # a launch without checkpoints pulls its passes too, before the meter's hook ends
    meter.install(ctx)  # its pass end comes after the plan's hooks' (minimize), before the checkpoint's save
    _installed = True
    return ctx


def _install_run_and_saves(paddle: Any, runtime_cls: type) -> None:
    """``Executor.run`` (a hook may replace the program it runs) and every save a fleet script can call (a hook
    prepares the scope and the arguments first: runtime/saves.py)."""
    from heterps_paddle.runtime import saves  # lazy, as heter_builder in install()

    original_run = paddle.static.Executor.run

    def run(self: Any, program: Any = None, *args: Any, **kwargs: Any) -> Any:
        redirect = context().run_redirect
        if redirect is not None and program is not None:
            program = redirect(self, program, kwargs.get("scope"))
        return original_run(self, program, *args, **kwargs)

    paddle.static.Executor.run = run

    for name in saves.FLEET_SAVES:
        _wrap_fleet_save(runtime_cls, name, saves.before_fleet_save, saves.after_fleet_save)
    _install_resume(paddle, runtime_cls)

    original_static_save_inference_model = paddle.static.save_inference_model
    original_static_save = paddle.static.save

    def save_inference_model(path_prefix: Any, feed_vars: Any, fetch_vars: Any, executor: Any, **kwargs: Any) -> Any:
        return saves.static_save_inference_model(
            original_static_save_inference_model, path_prefix, feed_vars, fetch_vars, executor, **kwargs
        )

    def save(program: Any, model_path: Any, *args: Any, **kwargs: Any) -> Any:
        return saves.static_save(original_static_save, program, model_path, *args, **kwargs)

    # Scripts call them as paddle.static.<name> (looked up at each call).
    paddle.static.save_inference_model = save_inference_model
    paddle.static.save = save


# Fleet's save methods that only barrier and pass (*args, **kwargs) on to the method that does the work: their
# arguments are named by that method's signature.
_SAVE_IMPLEMENTATIONS = {
    "_save_inference_model": "_ps_inference_save_inference_model",
    "_save_dense_params": "_ps_save_dense_params",
    "_save_persistables": "_save_distributed_persistables",
}


def _install_resume(paddle: Any, runtime_cls: Any) -> None:
    """``init_server(dirname)`` restores the dense tables too; trainers' ``init_worker`` does not push its initial
    dense values over tables the servers already hold (runtime/checkpoint.py)."""
    from paddle.distributed.communicator import Communicator

    from heterps_paddle.runtime import checkpoint, hooks, launch_checkpoints  # lazy, as heter_builder in install()

    original_init_server = runtime_cls._init_server
    if parameter_names(original_init_server)[:3] != ["self", "dirname", "var_names"]:
        raise PaddleBehaviourChanged(f"TheOnePSRuntime._init_server{parameter_names(original_init_server)}")

    def _init_server(self: Any, dirname: Any = None, var_names: Any = None, **kwargs: Any) -> Any:
        dirname = launch_checkpoints.server_start_dir(dirname)  # the launch's checkpoint, when it resumes
        if not dirname or var_names is not None:
            return original_init_server(self, dirname, var_names, **kwargs)
        dirname = os.path.normpath(dirname)
        # Paddle's own load refuses a table saved in another shard count with only a warning (the job trains from
        # an empty table): the server's tables are built here, loading nothing, and every sparse table is loaded
        # whole in this job's count (runtime/table_shards.py), then the dense ones (runtime/checkpoint.py)
        result = original_init_server(self, None, None, **kwargs)
        checkpoint.restore_tables(self, dirname)
        hooks.call("after_restore", self)
        return result

    runtime_cls._init_server = _init_server

    original_init_all = runtime_cls._init_all_params

    def _init_all_params(self: Any, scopes: Any, send_ctx: Any, recv_map: Any) -> Any:
        restored = checkpoint.servers_restored()
        if restored:
            return _resumed(recv_map, restored)
        return original_init_all(self, scopes, send_ctx, recv_map)

    runtime_cls._init_all_params = _init_all_params

    original_init_params = Communicator.init_params

    def init_params(self: Any, context: Any) -> Any:
        restored = checkpoint.servers_restored()
        if restored:
            return _resumed(context, restored)
        return original_init_params(self, context)

    Communicator.init_params = init_params


def _resumed(tables: Any, checkpoint_dir: str) -> list[str]:
    from heterps_paddle.log import logger  # lazy: keeps this module's imports minimal

    logger.info(
        "init_worker: the servers restored the dense tables %s from %s (init_server(dirname)): not overwritten "
        "with this trainer's initial values",
        sorted(tables),
        checkpoint_dir,
    )
    return [name for names in tables.values() for name in names]


def _wrap_fleet_save(runtime_cls: type, name: str, before: Callable[..., None], after: Callable[..., None]) -> None:
    original = getattr(runtime_cls, name, None)
    implementation = getattr(runtime_cls, _SAVE_IMPLEMENTATIONS.get(name, name), None)
    if original is None or implementation is None:
        raise PaddleBehaviourChanged(
            f"paddle.distributed.ps.the_one_ps.TheOnePSRuntime has no {name} / {_SAVE_IMPLEMENTATIONS.get(name)}"
        )
    signature = inspect.signature(implementation)

    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        # By name: fleet passes them positionally, the hooks read and replace them by name.
        arguments = dict(signature.bind(self, *args, **kwargs).arguments)
        del arguments["self"]
        before(name, self, arguments)
        result = original(self, **arguments)
        after(name, self, arguments)
        return result

    setattr(runtime_cls, name, save)


@contextlib.contextmanager
def supervised_launcher(
    attach: Callable[[Any], None], workers_started: Callable[[Any], None] | None = None
) -> Iterator[None]:
    """While the block runs, each ``ParameterServerLauncher.start_ps`` first hands its launcher to ``attach`` (the
    supervisor reads the launcher's processes), and to ``workers_started`` once its CPU trainers are started (before
    it waits on them); the class is restored when the block ends, whatever happened."""
    from paddle.distributed.fleet import launch_utils  # lazy: `heterps --help` must not import Paddle

    launcher_cls = getattr(launch_utils, "ParameterServerLauncher", None)
    if launcher_cls is None or not hasattr(launcher_cls, "start_ps"):
        raise PaddleBehaviourChanged("this Paddle has no ParameterServerLauncher.start_ps to supervise")
    own = "start_ps" in vars(launcher_cls)
    original = launcher_cls.start_ps

    def start_ps(self: Any) -> Any:
        attach(self)
        if workers_started is not None:
            start_pod_worker = self.start_pod_worker

            def started(args: Any, pod: Any) -> Any:
                result = start_pod_worker(args, pod)
                workers_started(self)
                return result

            self.start_pod_worker = started  # this launcher only
        return original(self)

    launcher_cls.start_ps = start_ps
    try:
        yield
    finally:
        if own:
            launcher_cls.start_ps = original
        else:
            del launcher_cls.start_ps
