"""The HeterPS meta optimizer: fleet's hook into ``minimize`` for parameter-server jobs.

It chains before Paddle's ``ParameterServerOptimizer``: fleet picks the longest chain of applicable
meta optimizers, and ours lists the PS optimizer as the one it may wrap.

Status: it validates the job and the configuration and hands the program to the PS optimizer
unchanged.  Profiling, scheduling and splitting the program into sections are added by the planning,
sections and end-to-end work (see the README's roadmap); nothing here pretends to do them yet.
"""

from __future__ import annotations

import logging

# Only modules fleet has already loaded when the hook runs (see _fleet_hook): importing more of Paddle
# here could run in the middle of ``import paddle``.
from paddle.distributed.fleet.base import meta_optimizer_factory
from paddle.distributed.fleet.meta_optimizers.meta_optimizer_base import MetaOptimizerBase

from .strategy import HeterPSConfigError, validate_heterps_configs

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
        if configs["plan"] is not None:
            # A saved plan: check the launch against it and, with more than one stage, tag the ops of each
            # stage (before backward, so grad ops inherit the tags) and let the fixed heter builder split
            # them into sections (heterps_paddle/sections, docs/sections.md).
            from .sections.plan import check_launch_matches, load_plan

            plan = load_plan(configs["plan"])
            check_launch_matches(plan)
            if plan.num_stages > 1:
                from .sections.runtime import prepare_sections

                layer_stage = prepare_sections(loss.block.program, plan, self.user_defined_strategy)
                logger.info("heterps: plan %s: %d stages, layers -> stage %s", configs["plan"],
                            plan.num_stages, layer_stage)
            else:
                logger.info("heterps: plan %s has one stage; program handed to ParameterServerOptimizer "
                            "unsplit", configs["plan"])
        else:
            logger.info("heterps: enabled with %s; program handed to ParameterServerOptimizer unchanged",
                        configs)
        return self.inner_opt.minimize(loss, startup_program, parameter_list, no_grad_set)


def register_meta_optimizer() -> None:
    """Make fleet's factory instantiate HeterPSOptimizer (it looks names up in its module globals)."""
    setattr(meta_optimizer_factory, META_OPTIMIZER_NAME, HeterPSOptimizer)
    if META_OPTIMIZER_NAME not in meta_optimizer_factory.meta_optimizer_names:
        meta_optimizer_factory.meta_optimizer_names.append(META_OPTIMIZER_NAME)
