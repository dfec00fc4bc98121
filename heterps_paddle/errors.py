"""One base class for errors a user caused (bad input, bad config): the CLI prints them without a
traceback and exits with status 2."""


class HeterPSError(Exception):
    """Base of every user-facing heterps-paddle error."""
