"""The strict reading of the planning files (docs/plan-formats.md): a hand-edited file's typo (``max_unit: 8``) must
not give a plan that looks right and is not, so every mapping is checked against its schema and every error names
the file, the key (as a path such as ``resource_types[2].memory``) and the reason."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import yaml

from heterps_paddle.errors import HeterPSError
from heterps_paddle.text_numbers import ascii_float

FORMAT_VERSION = 1


class PlanningInputError(HeterPSError, ValueError):
    """A model profile, cluster or plan file (or value) that cannot be used."""


# ---------------------------------------------------------------------------------------------- records


class Reader:
    """Checks one mapping against a schema, reporting ``file: key: reason``."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, reason: str) -> PlanningInputError:
        where = f"{self.source}: {key}" if key else self.source
        return PlanningInputError(f"{where}: {reason}")

    def mapping(self, value: Any, key: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a mapping, got {type(value).__name__}")
        for name in value:
            if name not in allowed:
                raise self.fail(join_key(key, str(name)), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for name in sorted(required):
            if name not in value:
                raise self.fail(join_key(key, name), "missing required key")
        return value

    def number(self, value: Any, key: str, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            # YAML reads 2.1e9 as a float but "2.1e9" quoted, or 1e9 without a dot, as a string.  ascii_float, not
            # float(): float() also reads "١٢" and "1_000" (heterps_paddle/text_numbers.py).
            if isinstance(value, str):
                try:
                    value = ascii_float(value)
                except ValueError:
                    raise self.fail(key, f"must be a number, got {value!r}") from None
            else:
                raise self.fail(key, f"must be a number, got {type(value).__name__} {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise self.fail(key, f"must be finite, got {number!r}")
        if number < 0:
            raise self.fail(key, f"must not be negative, got {number!r}")
        if positive and number == 0:
            raise self.fail(key, "must be positive, got 0")
        return number

    def integer(self, value: Any, key: str, minimum: int) -> int:
        number = self.number(value, key)
        if number != int(number):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if number < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        return int(number)

    def string(self, value: Any, key: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def sequence(self, value: Any, key: str, non_empty: bool = True) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, got {type(value).__name__}")
        if non_empty and not value:
            raise self.fail(key, "must not be empty")
        return value

    def format_version(self, document: Mapping[str, Any]) -> None:
        if document["format"] != FORMAT_VERSION or isinstance(document["format"], bool):
            raise self.fail(
                "format", f"unsupported format {document['format']!r} (this version reads {FORMAT_VERSION})"
            )

    def unique(self, names: list[str], key: str) -> None:
        seen: set[str] = set()
        for index, name in enumerate(names):
            if name in seen:
                raise self.fail(f"{key}[{index}].name", f"duplicate name {name!r}")
            seen.add(name)


def join_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def load_document(path: str) -> Any:
    """The one reader of profile, cluster and plan files: ``heterps plan``, ``heterps launch-args`` and
    ``strategy.heterps_configs`` all report a bad file with these messages."""
    if os.path.isdir(path):
        raise PlanningInputError(f"{path}: is a directory, not a file")
    if not os.path.isfile(path):
        raise PlanningInputError(f"{path}: file does not exist")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:  # unreadable (permissions, a dangling mount): the user's file, not a crash
        raise PlanningInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PlanningInputError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        if path.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)  # JSON is YAML too, so any suffix but .json goes through the YAML reader
    except yaml.MarkedYAMLError as exc:
        # One line with the place, rather than PyYAML's multi-line text that points at "<unicode string>".
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        why = "; ".join(part for part in (exc.problem, exc.context) if part)
        raise PlanningInputError(f"{path}: cannot parse as YAML: {where}{why}") from None
    except (ValueError, yaml.YAMLError) as exc:
        raise PlanningInputError(f"{path}: cannot parse: {exc}") from None


# -------------------------------------------------------------------------------------- model profile
