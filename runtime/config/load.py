"""Recipe loading: YAML recipe + CLI dotlist overrides → one typed, validated config.

Each component owns a small section of the schema (``schema.py``) and is handed only that
section. ``workload`` is a tagged union: its ``kind`` picks the schema (see
``trainforge.workloads``).

Every user mistake becomes a single :class:`RecipeError` that names the key. The result is a
``Recipe`` of dataclasses (``OmegaConf.to_object``): consumers read ``cfg.train.batch_size``,
and nothing holds an OmegaConf node past loading.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from trainforge.config.rules import literal_fields
from trainforge.config.schema import Recipe, TrainSection, check_batch_fits
from trainforge.errors import RecipeError, not_one_of
from trainforge.log import first_line


def load(recipe_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Load a recipe file, apply ``key=value`` overrides, and validate. Raises RecipeError."""
    path = Path(recipe_path)
    if not path.is_file():
        raise RecipeError(f"recipe not found: {path}")
    try:
        user = OmegaConf.load(path)
    except yaml.MarkedYAMLError as exc:
        raise RecipeError(yaml_error(path, exc)) from None
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        raise RecipeError(f"cannot read recipe {path}: {first_line(exc)}") from None
    if not isinstance(user, DictConfig):
        raise RecipeError(f"recipe {path} must be a mapping of sections, not a list")
    return with_overrides(user, overrides)


def from_mapping(data: Mapping[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """A recipe given as a mapping (the Python API's ``trainforge.train({...})``), with
    ``key=value`` overrides, validated as a file's is. Raises RecipeError."""
    try:
        user = OmegaConf.create(dict(data))
    except (OmegaConfBaseException, ValueError) as exc:
        raise RecipeError(f"recipe: {first_line(exc)}") from None
    return with_overrides(user, overrides)


def with_overrides(user: DictConfig, overrides: list[str] | tuple[str, ...]) -> Recipe:
    overriding = _parse_overrides(overrides)
    _nest_sweep_space(user)
    try:
        merged = OmegaConf.merge(user, overriding)
    except TypeError:  # a list onto a mapping, or a mapping onto a list: OmegaConf names no key
        key, given = _container_clash(user, overriding)
        if not key:
            raise
        shape = "a list" if isinstance(given, DictConfig) else "a mapping of settings"
        raise RecipeError(f"{key}: must be {shape}, got {_shown(given)}") from None
    assert isinstance(merged, DictConfig)
    return build(merged)


def from_container(data: dict[str, Any]) -> Recipe:
    """Rebuild the typed recipe from a plain dict (how workers receive it), validating it."""
    return build(OmegaConf.create(data))


def build(user: DictConfig) -> Recipe:
    """Merge user values onto the typed defaults, pick the workload schema, validate, and
    return the typed recipe: every section's checks run as its dataclass is built."""
    from trainforge.workloads import spec_for  # the registry: workload.kind → its schema

    for name in [str(k) for k in user]:
        if OmegaConf.is_interpolation(user, name):  # `train: ${run}`: a section is written out
            text = user._get_node(name)._value()  # type: ignore[union-attr]
            raise RecipeError(f"{name}: must be a section of settings, got {text!r}")
    with _key_errors(""):
        for name in Recipe.__dataclass_fields__:
            if name in user and name != "workload" and not isinstance(user[name], DictConfig):
                raise RecipeError(f"{name}: must be a section of settings, got {user[name]!r}")
        workload_user = user.get("workload") if "workload" in user else None
    body = OmegaConf.masked_copy(user, [str(k) for k in user if k != "workload"])
    cfg = _merge(OmegaConf.structured(Recipe), body)

    spec = spec_for(_workload_kind(workload_user))
    workload = _merge(OmegaConf.structured(spec.schema), workload_user, prefix="workload")
    with _key_errors("workload"):
        cfg.workload = workload
    _check_missing(cfg)
    recipe = OmegaConf.to_object(cfg)
    assert isinstance(recipe, Recipe)
    spec.check(recipe.workload, recipe)
    if not recipe.scaling.use_all_gpus:  # else the worker count is the cluster's: see resolve
        check_batch_fits(
            recipe.train, recipe.scaling.num_workers, spec.train_samples(recipe.workload)
        )
    return recipe


def typed_section(schema: type, values: dict[str, Any], key: str) -> Any:
    """``values`` checked against the dataclass ``schema`` as a recipe's own sections are (an
    unknown key, a wrong type, a missing value: a RecipeError naming ``key``.name), and
    returned as an instance of it: how a user's workload gets its own section."""
    merged = _merge(OmegaConf.structured(schema), OmegaConf.create(values), prefix=key)
    _check_missing(merged, key)
    try:
        return OmegaConf.to_object(merged)
    except (TypeError, ValueError) as exc:  # the dataclass's own __post_init__ checks
        raise RecipeError(f"{key}: {first_line(exc)}") from None


def to_yaml(cfg: Recipe) -> str:
    """The recipe as YAML (logged to MLflow and stored in checkpoints)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_container(cfg: Recipe) -> dict[str, Any]:
    """The recipe as plain dicts and lists (what the driver sends its workers)."""
    data = OmegaConf.to_container(OmegaConf.structured(cfg))
    assert isinstance(data, dict)
    return data  # type: ignore[return-value]


def global_batch(cfg: Recipe) -> int:
    """Samples per optimizer step across all workers."""
    return cfg.train.batch_size * cfg.scaling.num_workers * cfg.train.grad_accum_steps


def scaled_lr(train: TrainSection, global_batch_size: int) -> float:
    """The learning rate after ``train.lr_scaling`` for this global batch."""
    ratio = global_batch_size / train.lr_reference_batch
    if train.lr_scaling == "linear":
        return train.lr * ratio
    if train.lr_scaling == "sqrt":
        return train.lr * math.sqrt(ratio)
    return train.lr


# --- helpers -------------------------------------------------------------------------------

# An override's key: names joined by dots. OmegaConf's own key syntax goes further (``a[0]``,
# ``a\.b``, empty names from ``a..b``), which on the command line is only ever a typo and then
# fails far from it (an IndexError for ``[x``, or an unknown key named ``a.``).
_OVERRIDE_KEY = re.compile(r"[^\s.\[\]\\${}=]+(\.[^\s.\[\]\\${}=]+)*")


def yaml_error(path: Path, exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's syntax error as one line that keeps the file, line and column (1-based, as
    editors count) of the problem, and what it was inside of."""
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = exc.problem or exc.context or "YAML syntax error"
    context = ""
    if exc.context and exc.problem and exc.context_mark is not None:
        context = f" ({exc.context} at line {exc.context_mark.line + 1})"
    return f"recipe {where}: YAML syntax error: {problem}{context}"


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> DictConfig:
    """The ``key=value`` items as one config, applied in order; a bad item is named whole."""
    parsed = OmegaConf.create()
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not (key.isprintable() and _OVERRIDE_KEY.fullmatch(key)):
            raise RecipeError(
                f"override {item!r}: expected key=value with a dotted key (e.g. train.lr=0.01)"
            )
        try:
            parsed.merge_with_dotlist([item])
        except yaml.MarkedYAMLError as exc:  # the value: YAML, as in a recipe file
            problem = exc.problem or exc.context or "syntax error"
            raise RecipeError(f"override {item!r}: value is not valid YAML: {problem}") from None
        except UnicodeError:  # argv bytes that the locale's encoding could not decode
            raise RecipeError(f"override {item!r}: not valid UTF-8 text") from None
        except (OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
            raise RecipeError(f"override {item!r}: {first_line(exc)}") from None
    return parsed


def _nest_sweep_space(user: DictConfig) -> None:
    """sweep.space's dotted keys nested before the overrides merge: an override's key is
    always nested (``sweep.space.train.lr=…``), and would otherwise stand beside the recipe's
    ``train.lr`` rather than replace it."""
    from trainforge.config import sweep_space

    sweep = user._get_node("sweep") if "sweep" in user else None
    space = sweep._get_node("space") if isinstance(sweep, DictConfig) and "space" in sweep else None
    if not isinstance(space, DictConfig) or OmegaConf.is_interpolation(sweep, "space"):
        return  # not a mapping: the section's own checks name it
    written = OmegaConf.to_container(space, resolve=False)
    assert isinstance(sweep, DictConfig) and isinstance(written, dict)
    sweep.space = sweep_space.nested({str(k): v for k, v in written.items()})


def _workload_kind(workload_user: Any) -> str:
    if workload_user is None:
        raise RecipeError("workload: missing; the recipe needs a workload section with a kind")
    if not isinstance(workload_user, DictConfig):
        raise RecipeError("workload: must be a mapping with a kind (e.g. kind: cnn)")
    with _key_errors("workload"):  # `kind: ${nowhere}`
        kind = workload_user.get("kind")
    if kind is None:
        raise RecipeError("workload.kind: missing required value (e.g. cnn)")
    return str(kind)


def _merge(base: DictConfig, user: Any, prefix: str = "") -> DictConfig:
    if user is None:
        return base
    with _key_errors(prefix, schema=base):
        _check_shapes(base, user, prefix)
        user = _switches_as_text(OmegaConf.get_type(base), user)
        return OmegaConf.merge(base, user)  # type: ignore[return-value]


def _check_shapes(base: DictConfig, user: Any, prefix: str) -> None:
    """A mapping where the schema has a mapping (a FREE_FORM one too), a list where it has a
    list, and plain values inside the other free-form ones (``resources_per_worker``,
    ``observations``). OmegaConf checks none of this: a list merged onto a mapping is a
    TypeError with no key, and a list inside ``observations`` reaches the section's checks as
    a value."""
    if not isinstance(user, DictConfig):
        return
    free_form = getattr(OmegaConf.get_type(base), "FREE_FORM", ())
    for name in [str(k) for k in user]:
        if name not in base or OmegaConf.is_interpolation(user, name):
            continue
        key = _full_key(prefix, name)
        expected, given = base._get_node(name), user._get_node(name)
        if isinstance(expected, DictConfig) and not isinstance(given, DictConfig):
            raise RecipeError(f"{key}: must be a mapping of settings, got {_shown(given)}")
        if isinstance(expected, ListConfig) and not isinstance(given, ListConfig):
            raise RecipeError(f"{key}: must be a list, got {_shown(given)}")
        if name in free_form:  # a mapping of the user's own arguments: any values inside
            continue
        if isinstance(expected, DictConfig) and is_dataclass(OmegaConf.get_type(expected)):
            _check_shapes(expected, given, key)
        elif isinstance(given, DictConfig | ListConfig):
            items = given.items_ex(resolve=False) if isinstance(given, DictConfig) else None
            names = [str(k) for k, _ in items] if items is not None else range(len(given))
            for index in names:
                inner = given._get_node(index)  # type: ignore[arg-type]
                if isinstance(inner, DictConfig | ListConfig):
                    where = f"{key}.{index}" if isinstance(index, str) else f"{key}[{index}]"
                    raise RecipeError(f"{where}: must be a plain value, got {_shown(inner)}")


def _container_clash(base: Any, other: Any, prefix: str = "") -> tuple[str, Any]:
    """The first key where ``other`` has a list and ``base`` a mapping, or the other way round,
    and ``other``'s node there."""
    for name in [str(k) for k in other] if isinstance(other, DictConfig) else []:
        if not isinstance(base, DictConfig) or name not in base:
            continue
        key, mine, theirs = _full_key(prefix, name), base._get_node(name), other._get_node(name)
        if isinstance(mine, DictConfig) and isinstance(theirs, DictConfig):
            found = _container_clash(mine, theirs, key)
            if found[0]:
                return found
        elif {type(mine), type(theirs)} == {DictConfig, ListConfig}:
            return key, theirs
    return "", None


def _shown(node: Any) -> str:
    """A user's value as it reads in a message: plain Python, on one line."""
    if isinstance(node, DictConfig | ListConfig):
        return repr(OmegaConf.to_container(node, resolve=False))
    value = node._value() if hasattr(node, "_value") else node
    return repr(value)


def _switches_as_text(schema: Any, user: Any) -> Any:
    """YAML and the command line read ``true``/``false`` as bools; a field whose choices are
    text (``Switch``: auto | true | false) takes them as that text."""
    if not (isinstance(schema, type) and is_dataclass(schema) and isinstance(user, DictConfig)):
        return user
    hints = typing.get_type_hints(schema)
    switches = literal_fields(schema)
    for name in [str(k) for k in user]:
        if name not in hints or OmegaConf.is_interpolation(user, name):
            continue
        if OmegaConf.is_missing(user, name):
            continue
        value = user[name]
        if name in switches and isinstance(value, bool) and str(value).lower() in switches[name]:
            user[name] = str(value).lower()
        elif isinstance(value, DictConfig):
            _switches_as_text(hints[name], value)
    return user


class _key_errors:
    """Turn OmegaConf's merge/validation errors into one RecipeError naming the full key."""

    def __init__(self, prefix: str, schema: DictConfig | None = None) -> None:
        self.prefix = prefix
        self.schema = schema

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, OmegaConfBaseException):
            return  # not ours: it propagates unchanged
        key = _full_key(self.prefix, getattr(exc, "full_key", "") or "") or "recipe"
        if isinstance(exc, ConfigKeyError | ConfigAttributeError):
            raise RecipeError(f"{key}: unknown key{self._did_you_mean(key)}") from None
        if isinstance(exc, ValidationError):
            value = getattr(exc, "value", None)
            choices = _literal_choices(exc)
            if choices:
                raise not_one_of(key, value, choices) from None
            expected = _expected_type(exc)
            raise RecipeError(f"{key}: wrong type, got {value!r}{expected}") from None
        if isinstance(exc, GrammarParseError | InterpolationResolutionError):
            raise RecipeError(f"{key}: {first_line(exc)}") from None
        raise RecipeError(f"{key}: {first_line(exc)}") from None

    def _did_you_mean(self, key: str) -> str:
        if self.schema is None:
            return ""
        candidates = _all_keys(self.schema, self.prefix)
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
        if not close:
            # A wrong section is common (lr under run:): match the last part alone too.
            leaf = key.rsplit(".", 1)[-1]
            close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1]
        return f" (did you mean '{close[0]}'?)" if close else ""


def _all_keys(node: Any, prefix: str) -> list[str]:
    keys: list[str] = []
    if isinstance(node, DictConfig):
        for name in node:
            full = _full_key(prefix, str(name))
            keys.append(full)
            child = node._get_node(name)
            # Recurse into schema sections only: resources_per_worker is a free-form mapping.
            if isinstance(child, DictConfig) and is_dataclass(OmegaConf.get_type(child)):
                keys.extend(_all_keys(child, full))
    return keys


def _full_key(prefix: str, key: str) -> str:
    key = str(key)
    if prefix and key and not key.startswith(prefix + "."):
        return f"{prefix}.{key}"
    return key or prefix


def _expected_type(exc: ValidationError) -> str:
    text = str(exc).splitlines()[0]
    # OmegaConf says e.g. "Value 'abc' of type 'str' could not be converted to Integer"
    if "could not be converted to" in text:
        return ", expected " + text.split("could not be converted to", 1)[1].strip().lower()
    return f" ({text})"


def _literal_choices(exc: ValidationError) -> tuple[Any, ...]:
    """The allowed values when the failed field is a ``Literal`` choice, else ()."""
    schema, name = getattr(exc, "object_type", None), getattr(exc, "key", None)
    if not (isinstance(schema, type) and is_dataclass(schema) and isinstance(name, str)):
        return ()
    return literal_fields(schema).get(name, ())


def _check_missing(cfg: DictConfig | ListConfig, prefix: str = "") -> None:
    """Every required value given, and every interpolation resolving to a value that its
    setting takes; each problem named by its key (OmegaConf's own errors often carry none)."""
    keys: list[Any] = list(cfg) if isinstance(cfg, DictConfig) else list(range(len(cfg)))
    for key in keys:
        full = _full_key(prefix, str(key)) if isinstance(cfg, DictConfig) else f"{prefix}[{key}]"
        if OmegaConf.is_missing(cfg, key):
            raise RecipeError(f"{full}: missing required value")
        if OmegaConf.is_interpolation(cfg, key):
            try:
                value = cfg[key]  # resolves it, and checks a plain value against its type
            except OmegaConfBaseException as exc:
                raise RecipeError(f"{full}: {first_line(exc)}") from None
            node = cfg._get_node(key)
            if isinstance(node, DictConfig | ListConfig) and not isinstance(
                value, DictConfig | ListConfig
            ):  # OmegaConf checks no container: it would fail later, naming no key
                shape = "a list" if isinstance(node, ListConfig) else "a mapping of settings"
                raise RecipeError(f"{full}: must be {shape}, got {value!r}")
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig | ListConfig):
            _check_missing(child, full)
