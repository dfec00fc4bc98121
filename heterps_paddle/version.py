"""The package's version, in a base module of its own: the measurement cache and the plan's input digest record
it, and importing it from the package root would run the root's fleet hook installation from below (the root
imports fleet/hook.py)."""

__version__ = "0.1.0"
