"""The HeterPS meta optimizer: fleet's hook into ``minimize`` for parameter-server jobs.

It chains before Paddle's ``ParameterServerOptimizer``: fleet picks the longest chain of applicable
meta optimizers, and ours lists the PS optimizer as the one it may wrap.

In ``minimize`` it takes the plan (a saved one, or made here by the automatic path: auto_plan.py),
checks the launch against it, cuts a split plan into sections (sections/), moves embeddings placed on a
GPU stage into the project's table (sections/gpu_embedding.py), and hands the program on to the PS
optimizer.  Without a cluster or a plan the program goes to the PS optimizer unchanged.
"""

from __future__ import annotations

import logging

# Only modules fleet has already loaded when the hook runs (see _fleet_hook): importing more of Paddle
# here could run in the middle of ``import paddle``.
from paddle.distributed.fleet.base import meta_optimizer_factory
from paddle.distributed.fleet.meta_optimizers.meta_optimizer_base import MetaOptimizerBase

from heterps_paddle.fleet.strategy import HeterPSConfigError, validate_heterps_configs

logger = logging.getLogger("heterps_paddle")

META_OPTIMIZER_NAME = "HeterPSOptimizer"


class HeterPSOptimizer(MetaOptimizerBase):
    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.inner_opt = optimizer
        self.meta_optimizers_white_list = ["ParameterServerOptimizer"]
        self.meta_optimizers_black_list = []

    def _can_apply(self):
        strategy = self.user_defined_strategy
        if not getattr(strategy, "heterps", False):
            return False
        if self.role_maker._is_collective:
            raise HeterPSConfigError(
                "strategy.heterps = True needs a parameter-server job, but this fleet job is collective "
                "(fleet.init(is_collective=True) or a collective launch). Launch with --server_num/--worker_num "
                "and fleet.init() (PaddleCloudRoleMaker, is_collective=False), or set strategy.heterps = False.")
        if strategy.a_sync_configs["k_steps"] < 0:
            raise HeterPSConfigError(
                "strategy.heterps = True needs Paddle's parameter-server optimizer, which is disabled by "
                f"a_sync_configs['k_steps'] = {strategy.a_sync_configs['k_steps']}; use k_steps >= 0.")
        return True

    def _disable_strategy(self, dist_strategy):
        # Called by fleet on every meta optimizer not applied: keep the user's choice visible but inert.
        object.__setattr__(dist_strategy, "_heterps_flag", False)

    def _enable_strategy(self, dist_strategy, context=None):
        object.__setattr__(dist_strategy, "_heterps_flag", True)

    def minimize_impl(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        # Re-validate: the configs dict may have been mutated in place after assignment.
        configs = validate_heterps_configs(dict(self.user_defined_strategy.heterps_configs))
        section_plan = None
        if configs["plan"] is not None:
            from heterps_paddle.runtime.plan import load_plan
            from heterps_paddle.fleet.strategy import LOCAL_CLUSTER

            # with "local" the resource names say their kind (local_cpu, local_gpu)
            section_plan = load_plan(configs["plan"], None if configs["cluster"] == LOCAL_CLUSTER
                                     else configs["cluster"])
        elif configs["cluster"] is not None:
            # The automatic path: profile -> schedule -> provision, once per launch (auto_plan.py).
            import paddle

            from heterps_paddle.fleet.auto_plan import plan_for_job
            from heterps_paddle.runtime.plan import plan_from_dict

            job = plan_for_job(loss, startup_program or paddle.static.default_startup_program(),
                               self.user_defined_optimizer, configs)
            print(f"heterps: plan written to {job.plan_path}\n{job.report}", flush=True)
            section_plan = plan_from_dict(job.plan.to_dict(), job.plan_path,
                                          kinds={t.name: t.kind for t in job.cluster.resource_types})
        if section_plan is None:
            logger.info("heterps: no cluster or plan given; program handed to ParameterServerOptimizer unchanged")
        else:
            self._apply_plan(loss, section_plan, startup_program)
        gpu_tables = []
        if section_plan is not None:
            # Sparse layers on a GPU stage live in the project's table, synced with the servers per pass: the
            # servers' rule is set before the PS optimizer, the trainer program is rewritten after it.
            from heterps_paddle.runtime import gpu_embedding

            gpu_tables = gpu_embedding.prepare(loss.block.program, section_plan, self.user_defined_optimizer,
                                               self.user_defined_strategy)
        result = self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)
        if gpu_tables:
            import paddle

            gpu_embedding.apply(loss.block.program, [paddle.static.default_startup_program(), startup_program],
                                gpu_tables)
        return result

    def _apply_plan(self, loss, section_plan, startup_program=None):
        """Check the launch against the plan and, with more than one stage, tag each stage's ops (before
        backward, so grad ops inherit the tags) for the fixed heter builder to split into sections
        (heterps_paddle/sections, docs/sections.md)."""
        from heterps_paddle.runtime.plan import check_launch_matches

        check_launch_matches(section_plan)
        if section_plan.num_stages > 1:
            from heterps_paddle.runtime.sections import prepare_sections

            layer_stage = prepare_sections(loss.block.program, section_plan, self.user_defined_strategy,
                                           startup_program, loss)
            logger.info("heterps: plan %s: %d stages, layers -> stage %s", section_plan.path,
                        section_plan.num_stages, layer_stage)
        else:
            logger.info("heterps: plan %s has one stage; program handed to ParameterServerOptimizer unsplit",
                        section_plan.path)


def register_meta_optimizer() -> None:
    """Make fleet's factory instantiate HeterPSOptimizer (it looks names up in its module globals)."""
    setattr(meta_optimizer_factory, META_OPTIMIZER_NAME, HeterPSOptimizer)
    if META_OPTIMIZER_NAME not in meta_optimizer_factory.meta_optimizer_names:
        meta_optimizer_factory.meta_optimizer_names.append(META_OPTIMIZER_NAME)
