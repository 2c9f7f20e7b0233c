"""What every recipe section shares: its full key, and value checks that name it.

A section checks itself when it is constructed (``__post_init__``), whether OmegaConf builds it
from YAML or code builds it directly, so an invalid section object does not exist. Checks only
read: values the driver decides later (worker counts, data paths) are filled in by
``trainforge.config.resolve``, never by a check.
"""

from __future__ import annotations

import math
import typing
from typing import Any, ClassVar

from omegaconf import MISSING

from trainforge.errors import RecipeError, not_one_of


class Section:
    """Base of every section dataclass. ``KEY`` is the section's dotted place in a recipe
    (``train``, ``workload.simulation``), so messages name the full key."""

    KEY: ClassVar[str] = ""
    FREE_FORM: ClassVar[tuple[str, ...]] = ()
    """Fields whose mappings are the user's own, nested as they like (a user's workload
    settings): checked by their owner, not held to plain values."""

    def __post_init__(self) -> None:
        for name, choices in literal_fields(type(self)).items():
            value = getattr(self, name)
            if value != MISSING and value not in choices:
                raise not_one_of(self.key(name), value, choices)
        for name, value in vars(self).items():  # the dataclass's fields
            problem = _value_problem(value)
            if problem:
                raise RecipeError(f"{self.key(name)}: {problem}")
        self.check()

    def check(self) -> None:
        """The section's own value checks; raise RecipeError naming the full key."""

    def key(self, name: str) -> str:
        return f"{self.KEY}.{name}" if self.KEY else name

    def at_least(self, name: str, low: float) -> None:
        value = getattr(self, name)
        if value is not None and value < low:
            suffix = " (or null)" if _optional(type(self), name) else ""
            raise RecipeError(f"{self.key(name)}: must be >= {low}{suffix}, got {value}")

    def at_most(self, name: str, high: float, meaning: str = "") -> None:
        value = getattr(self, name)
        if value is not None and value > high:
            why = f" ({meaning})" if meaning else ""
            raise RecipeError(f"{self.key(name)}: must be <= {high}{why}, got {value}")

    def positive(self, name: str) -> None:
        value = getattr(self, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            suffix = " (or null)" if _optional(type(self), name) else ""
            raise RecipeError(f"{self.key(name)}: must be > 0{suffix}, got {value}")

    def fraction(self, name: str, closed: bool = False) -> None:
        """A share: in [0, 1] when ``closed``, else strictly between 0 and 1."""
        value = getattr(self, name)
        inside = 0 <= value <= 1 if closed else 0 < value < 1
        if not inside:
            span = "[0, 1]" if closed else "(0, 1)"
            raise RecipeError(f"{self.key(name)}: must be in {span}, got {value}")


_LITERALS: dict[type, dict[str, tuple[Any, ...]]] = {}


def literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field name → allowed values, for the fields typed with a ``Literal[...]`` alias."""
    if cls not in _LITERALS:  # resolving the hints is slow; sections are built often
        hints = typing.get_type_hints(cls)
        _LITERALS[cls] = {
            name: typing.get_args(hint)
            for name, hint in hints.items()
            if typing.get_origin(hint) is typing.Literal
        }
    return _LITERALS[cls]


def _value_problem(value: Any) -> str | None:
    """What no setting takes, whatever its type: a NaN or infinite number (every check would
    pass it: NaN compares false), an integer past int64 (torch cannot hold it), text with a NUL
    (no path or name holds one), with a literal ``${`` (printed or sent to a worker, it is read
    as an interpolation again), or with bytes that were not UTF-8 (an environment variable read
    through ``${oc.env:…}`` that the locale could not decode: it cannot be printed)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if isinstance(value, int) and not -(2**63) <= value < 2**63:  # torch's and numpy's int64
        return f"must be within ±2**63, got {value}"
    if isinstance(value, str):
        if "\x00" in value:
            return f"must not hold a NUL character, got {value!r}"
        if "${" in value:  # from an escaped `\${…}`
            return f"must not hold a literal '${{', got {value!r}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"must be UTF-8 text, got {value!r}"
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, list):
        return next(filter(None, map(_value_problem, value)), None)
    return None


def _optional(cls: type, name: str) -> bool:
    return type(None) in typing.get_args(typing.get_type_hints(cls).get(name))
