"""heterps-paddle: HeterPS scheduling and heterogeneous training for PaddlePaddle fleet.

``import heterps_paddle`` in a fleet script adds ``strategy.heterps`` and
``strategy.heterps_configs`` to ``paddle.distributed.fleet.DistributedStrategy`` and registers the
HeterPS meta optimizer with fleet.

The hook is installed lazily (a post-import hook on ``paddle.distributed.fleet``) so that the planning
half of the package (``heterps_paddle.planning``, ``heterps plan``) never imports Paddle: it is pure
Python and usable on machines without Paddle installed.
"""

from heterps_paddle.fleet.hook import install_fleet_hook
from heterps_paddle.paddle_engine import check_installed
from heterps_paddle.version import __version__

__all__ = ["__version__"]

check_installed()  # a Paddle without the parameter-server engine is refused here, by name (paddle_engine.py)
install_fleet_hook()
