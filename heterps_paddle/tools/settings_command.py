"""``heterps settings``: every HETERPS_* environment variable the package reads, with its default and meaning."""

from __future__ import annotations

import argparse

from heterps_paddle import settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print(settings.describe())
    return 0
