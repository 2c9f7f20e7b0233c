"""A sweep's search space as a recipe writes it: a recipe key and a distribution over its
values, ``train.lr: loguniform(1e-4, 1e-1)``.

Four distributions, named as Ray Tune names them:

- ``uniform(low, high)`` and ``loguniform(low, high)``: a float between the two (low > 0 for
  the log scale);
- ``randint(low, high)``: an integer, both ends included;
- ``choice(a, b, …)``: one of the values (numbers, text, true/false), as each would be written
  after ``key=`` on the command line. A YAML list is the same as ``choice``.

The keys may be written dotted (``train.lr``) or nested (``train: {lr: …}``), as overrides
do (``sweep.space.train.lr='loguniform(1e-4, 1e-1)'``): both name the same setting.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from trainforge.errors import RecipeError

KINDS = ("uniform", "loguniform", "randint", "choice")
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)$")
_CALL = re.compile(r"^\s*([a-z]+)\s*\((.*)\)\s*$", re.DOTALL)
# the keys that make a trial the run it is: set by the sweep for each trial
RESERVED = ("run.name", "run.storage_path", "checkpoint.resume", "sweep.")


@dataclass(frozen=True)
class Dimension:
    """One key of the space and the values it may take."""

    key: str
    kind: str
    values: tuple[Any, ...]
    """(low, high) for uniform, loguniform and randint; the choices for choice."""

    def candidates(self) -> tuple[Any, ...]:
        """Values the recipe is checked with before any trial starts: both ends, or every
        choice. A space whose ends load loads everywhere between them."""
        return self.values

    def written(self) -> str:
        """As a recipe writes it."""
        return f"{self.kind}({', '.join(override_value(v) for v in self.values)})"


def parse(space: dict[str, Any]) -> list[Dimension]:
    """The space's dimensions, in the order written; a RecipeError naming the key whose
    distribution cannot be read."""
    dimensions = [_dimension(key, written) for key, written in _flat(space, "").items()]
    for dimension in dimensions:
        if any(dimension.key == r or dimension.key.startswith(r) for r in RESERVED if r[-1] == "."):
            raise RecipeError(f"sweep.space.{dimension.key}: the sweep's own settings are not "
                              "searched")  # fmt: skip
        if dimension.key in RESERVED:
            raise RecipeError(f"sweep.space.{dimension.key}: set by the sweep for each trial "
                              "(its name, its folder under the sweep's, resumed when the sweep "
                              "is run again)")  # fmt: skip
    return dimensions


def override_value(value: Any) -> str:
    """A value as written after ``key=`` (the trial's command line): YAML reads it back as
    the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def nested(space: dict[str, Any]) -> dict[str, Any]:
    """The space with its dotted keys nested, as an override writes them: an override of a key
    the recipe writes dotted then replaces the recipe's distribution rather than standing
    beside it (and one of the two silently searched)."""
    tree: dict[str, Any] = {}
    for key, written in _flat(space, "").items():
        node, names = tree, key.split(".")
        for depth, name in enumerate(names):
            if depth == len(names) - 1 and name not in node:
                node[name] = written
                break
            node = node.setdefault(name, {})
            if not isinstance(node, dict) or depth == len(names) - 1:
                clash = ".".join(names[: depth + 1])
                raise RecipeError(f"sweep.space.{clash}: written both as a distribution and "
                                  "as a mapping of the keys under it")  # fmt: skip
    return tree


def _flat(space: dict[str, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in space.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and not value:
            raise RecipeError(f"sweep.space.{key}: an empty mapping searches nothing")
        inner = _flat(value, key + ".") if isinstance(value, dict) else {key: value}
        # `train.lr` and `train: {lr}` in one space: one would silently replace the other
        twice = sorted(inner.keys() & flat.keys())
        if twice:
            raise RecipeError(f"sweep.space.{twice[0]}: written twice (dotted and nested); "
                              "keep one")  # fmt: skip
        flat |= inner
    return flat


def _dimension(key: str, written: Any) -> Dimension:
    where = f"sweep.space.{key}"
    if isinstance(written, list | tuple):
        return _choice(where, key, list(written))
    if not isinstance(written, str):
        raise RecipeError(f"{where}: must be a distribution such as loguniform(1e-4, 1e-1) or "
                          f"choice(64, 128), got {written!r}")  # fmt: skip
    call = _CALL.match(written)
    if call is None or call.group(1) not in KINDS:
        known = ", ".join(k + "(…)" for k in KINDS)
        raise RecipeError(f"{where}: {written!r} is not one of {known}")
    kind, arguments = call.group(1), _arguments(where, call.group(2))
    if kind == "choice":
        return _choice(where, key, arguments)
    if len(arguments) != 2:
        raise RecipeError(f"{where}: {kind} takes two values (low, high), got {written!r}")
    low, high = arguments
    if kind == "randint":
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
            raise RecipeError(f"{where}: randint takes two integers, got {written!r}")
        if low > high:
            raise RecipeError(f"{where}: randint's low {low} is above its high {high}")
        return Dimension(key, kind, (low, high))
    if not all(_real(v) for v in (low, high)):
        raise RecipeError(f"{where}: {kind} takes two finite numbers, got {written!r}")
    low, high = float(low), float(high)
    if not low < high:
        raise RecipeError(f"{where}: {kind}'s low {low:g} must be below its high {high:g}")
    if kind == "loguniform" and low <= 0:
        raise RecipeError(f"{where}: loguniform needs a low above 0, got {low:g}")
    return Dimension(key, kind, (low, high))


def _choice(where: str, key: str, values: list[Any]) -> Dimension:
    if not values:
        raise RecipeError(f"{where}: choice needs at least one value")
    for value in values:
        if isinstance(value, dict | list) or value is None:
            raise RecipeError(f"{where}: choice takes plain values (numbers, text, true/false), "
                              f"got {value!r}")  # fmt: skip
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{where}: choice takes finite numbers, got {value!r}")
    if len(set(map(repr, values))) != len(values):
        raise RecipeError(f"{where}: choice lists a value twice ({values!r})")
    return Dimension(key, "choice", tuple(values))


def _arguments(where: str, text: str) -> list[Any]:
    """The values between the parentheses, each read as YAML reads a value."""
    try:
        values = yaml.safe_load(f"[{text}]")
    except yaml.YAMLError:
        raise RecipeError(f"{where}: cannot read the values {text!r}") from None
    if not isinstance(values, list):
        raise RecipeError(f"{where}: cannot read the values {text!r}")
    return [_number(v) for v in values]


def _number(value: Any) -> Any:
    """PyYAML reads ``1e-4`` (no dot) as text; OmegaConf, and so the recipe, as a number."""
    if isinstance(value, str) and _FLOAT.match(value):
        return float(value)
    return value


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
