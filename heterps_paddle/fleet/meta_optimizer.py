"""The HeterPS meta optimizer: fleet's hook into ``minimize`` for parameter-server jobs.

It chains before Paddle's ``ParameterServerOptimizer``: fleet picks the longest chain of applicable meta
optimizers, and ours lists the PS optimizer as the one it may wrap.

In ``minimize`` it takes the plan (a saved one, checked against the launch; or the one the automatic path makes
within the launch: fleet/auto_plan.py), applies it to this process (runtime/sections.py: a split plan is cut into
sections, heterogeneous trainers are taken over, unused ones leave), moves embeddings placed on a GPU stage into
the project's table (runtime/gpu_embedding.py), and hands the program on to the PS optimizer.  Without a cluster
or a plan the program goes to the PS optimizer unchanged.
"""

from __future__ import annotations

from typing import Any

import paddle

# Only modules fleet has already loaded when the hook runs (fleet/hook.py): the hook runs in the middle of
# ``import paddle`` (Paddle imports its fleet package), so this module imports nothing that imports Paddle's other
# modules or the heterps modules that do: the automatic path (fleet/auto_plan.py) and the runtime are imported
# in minimize_impl.  (Seen when they were imported here: `import paddle` in program/profiler.py re-entered it
# through this hook, a circular import.)
from paddle.distributed.fleet.meta_optimizers.meta_optimizer_base import MetaOptimizerBase

from heterps_paddle.fleet.plan_files import LOCAL_CLUSTER
from heterps_paddle.fleet.strategy import HeterPSConfigError, configured_plan, validate_heterps_configs
from heterps_paddle.log import configure as configure_logging
from heterps_paddle.planning.launch import check_launch_matches, launch_from_env
from heterps_paddle.planning.model import Plan, load_cluster
from heterps_paddle.runtime.patches import set_heterps_flag
from heterps_paddle.runtime.seam import is_collective


class HeterPSOptimizer(MetaOptimizerBase):  # type: ignore[misc]  # Paddle ships no type stubs: its base is Any
    def __init__(self, optimizer: Any):
        super().__init__(optimizer)
        self.inner_opt = optimizer
        self.meta_optimizers_white_list = ["ParameterServerOptimizer"]
        self.meta_optimizers_black_list: list[str] = []

    def _can_apply(self) -> bool:
        strategy = self.user_defined_strategy
        if not getattr(strategy, "heterps", False):
            return False
        if is_collective(self.role_maker):
            raise HeterPSConfigError(
                "strategy.heterps = True needs a parameter-server job, but this fleet job is collective "
                "(fleet.init(is_collective=True) or a collective launch). Launch with --server_num/--worker_num "
                "and fleet.init() (PaddleCloudRoleMaker, is_collective=False), or set strategy.heterps = False."
            )
        if strategy.a_sync_configs["k_steps"] < 0:
            raise HeterPSConfigError(
                "strategy.heterps = True needs Paddle's parameter-server optimizer, which is disabled by "
                f"a_sync_configs['k_steps'] = {strategy.a_sync_configs['k_steps']}; use k_steps >= 0."
            )
        return True

    def _disable_strategy(self, dist_strategy: Any) -> None:
        # Called by fleet on every meta optimizer not applied: keep the user's choice visible but inert.
        set_heterps_flag(dist_strategy, False)

    def _enable_strategy(self, dist_strategy: Any, context: Any = None) -> None:
        set_heterps_flag(dist_strategy, True)

    def minimize_impl(
        self, loss: Any, startup_program: Any = None, parameter_list: Any = None, no_grad_set: Any = None
    ) -> Any:
        configure_logging()
        # Re-validate: the configs dict may have been mutated in place after assignment.
        configs = validate_heterps_configs(dict(self.user_defined_strategy.heterps_configs))
        plan = self._plan(loss, startup_program, configs)
        gpu_tables: list[Any] = []
        if plan is not None:
            from heterps_paddle.program.partition import planned_layers  # lazy: see the imports at the top
            from heterps_paddle.runtime import gpu_embedding, sections

            # The program's layers, grouped and checked against the plan once, for both passes that read them.
            layers = planned_layers(loss.block.program, plan)
            sections.apply_plan(loss, plan, startup_program, layers)
            # Sparse layers on a GPU stage live in the project's table, synced with the servers per pass: the
            # servers' rule is set before the PS optimizer, the trainer program is rewritten after it.
            gpu_tables = gpu_embedding.prepare(
                loss.block.program, plan, self.user_defined_optimizer, self.user_defined_strategy, layers
            )
        result = self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
        if gpu_tables:
            gpu_embedding.apply(
                loss.block.program, [paddle.static.default_startup_program(), startup_program], gpu_tables
            )
        return result

    def _plan(self, loss: Any, startup_program: Any, configs: dict[str, Any]) -> Plan | None:
        """The plan this job runs: a saved one, one made within the launch, or None (program unchanged)."""
        from heterps_paddle.fleet import plan_agreement  # lazy: see the imports at the top

        if configs["plan"] is not None:
            plan = configured_plan(configs)  # validate_heterps_configs has read it: a bad plan was refused there
            check_launch_matches(plan, launch_from_env(), source=f"plan {configs['plan']}")
            plan_agreement.agree(plan, prices=_prices(configs))
            return plan
        if configs["cluster"] is not None:
            from heterps_paddle.fleet.auto_plan import plan_for_job  # lazy: see the imports at the top

            job = plan_for_job(
                loss, startup_program or paddle.static.default_startup_program(), self.user_defined_optimizer, configs
            )
            plan_agreement.agree(job.plan, job.report, job.inputs)
            return job.plan
        return None


def _prices(configs: dict[str, Any]) -> dict[str, float] | None:
    """Each resource type's price per hour, from the configured cluster (``local``: this machine's, as its report
    prices it; None: no cluster: the job's cost is not known, only its rates)."""
    if configs["cluster"] is None:
        return None
    if configs["cluster"] == LOCAL_CLUSTER:
        from heterps_paddle.fleet.auto_plan import local_cluster  # lazy: see the imports at the top

        return {t.name: t.price_per_hour for t in local_cluster().resource_types}
    return {t.name: t.price_per_hour for t in load_cluster(configs["cluster"]).resource_types}
