"""The one ``heterps`` logger.  In a launched job its lines go to the process's log (stdout), prefixed
``heterps:``, which is how the tests, the launcher and people find them.

A handler is attached only if the application has not configured the logger itself.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("heterps")


def configure() -> logging.Logger:
    """Give the ``heterps`` logger a stdout handler at INFO, once, unless someone already configured it."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("heterps: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
