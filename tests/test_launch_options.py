"""``heterps launch``'s command line (launch/options.py) against Paddle's own parser."""

import sys

from heterps_paddle.launch.options import OWN_FLAGS, OWN_VALUED, PADDLE_VALUED


def paddles_options():
    """The options of Paddle's legacy launcher's parser (fleet/launch.py: _parse_args), as the installed Paddle has
    them, and whether each takes a value."""
    import argparse

    from paddle.distributed.fleet import launch as paddle_launch

    seen = {}
    original = argparse.ArgumentParser.parse_known_args

    def capture(self, args=None, namespace=None):
        for action in self._actions:
            for option in action.option_strings:
                seen[option] = action.nargs != 0
        return original(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = capture
    saved = sys.argv
    try:
        sys.argv = ["paddle.distributed.launch", "train.py"]
        paddle_launch._parse_args()
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = saved
    return seen


def test_every_paddle_launcher_option_is_known_and_takes_a_value():
    found = paddles_options()
    found.pop("-h")
    found.pop("--help")
    # Paddle's --host (its elastic mode) is heterps launch's own: this host's address across hosts
    assert set(found) - {"--host"} <= set(PADDLE_VALUED), set(found) - set(PADDLE_VALUED)
    assert all(found.values()), found
    assert not (set(OWN_VALUED) | set(OWN_FLAGS)) & (set(found) - {"--host"})
