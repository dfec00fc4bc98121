"""The error base and the exit statuses: one home, below every layer, so a command module anywhere and the
automatic path that reads a command's status share them without importing the CLI.

A user-caused error (bad input, bad config) is a ``HeterPSError``: the CLI prints it without a traceback and exits
with ``EXIT_INPUT_ERROR``.  As grep's 0/1/2: 0 an answer, 1 an answer that is not a plan (``heterps plan`` on a
target no plan meets), 2 invalid input.
"""

EXIT_OK = 0
EXIT_INFEASIBLE = 1  # `heterps plan`: some target has no plan (the answer is still printed, "feasible": false)
EXIT_INPUT_ERROR = 2  # every HeterPSError a command raises


class HeterPSError(Exception):
    """Base of every user-facing heterps-paddle error."""


class CommandError(HeterPSError):
    """A user-facing error raised by a command's own argument checks."""
