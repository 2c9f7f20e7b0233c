"""Malformed recipes and overrides, generated (hypothesis), through the command a user types.

`trainforge validate <recipe> key=value…` runs in-process (``cli.main``) on the shipped recipes
with generated overrides — keys from the real schema, misspelt, in unknown sections or nested
too deep; values of the wrong type or shape, YAML specials, broken syntax, interpolations that
point nowhere — and on recipe files mutated from the shipped ones. `train` runs the same way up
to the point where it would connect to Ray. Every input must either load or exit 2 with one
``trainforge: error:`` line naming the key (or the file, line and column of a YAML syntax
error); never a traceback, never a started worker. What loads must validate again to the same
recipe, and hold only values that the workers' own constructors accept (issue 16).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import math
import os
import re
import sys
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainforge import cli, config
from trainforge.config.schema import Recipe
from trainforge.driver import launch
from trainforge.tracking import driver as tracking_driver
from trainforge.workloads.cnn.checks import KNOWN_DATASETS, KNOWN_MODELS
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.estimator import ESTIMATORS
from trainforge.workloads.sbi.sources import KNOWN_TASKS

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "recipes").rglob("*.yaml"))
DOCS = {path: yaml.safe_load(path.read_text()) for path in SHIPPED}
ERROR = "trainforge: error: "
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
SBI_DEBUG = REPO / "recipes" / "sbi" / "two_moons_debug.yaml"


@pytest.fixture(autouse=True, scope="module")
def _undecodable_variable() -> Iterator[None]:
    """An environment variable holding bytes that are not UTF-8, as a shell may pass one
    (Python decodes it with surrogateescape); a value may read it through ``${oc.env:…}``."""
    os.environ["TRAINFORGE_FUZZ_NOT_UTF8"] = "run\udcff"
    yield
    del os.environ["TRAINFORGE_FUZZ_NOT_UTF8"]


class _ReachedRay(Exception):
    """Raised where `train` would pick its workers (and join Ray): every check before workers
    start passed."""


@pytest.fixture(autouse=True)
def _ray_door(monkeypatch: pytest.MonkeyPatch) -> None:
    """No command here may get as far as Ray: `train` stops at its door, and `validate` must
    never knock."""

    def door(*args: object, **kwargs: object) -> None:
        raise _ReachedRay()

    monkeypatch.setattr(launch, "choose", door)
    monkeypatch.setattr(launch, "connect", door)  # `simulate` joins Ray itself
    # `train` records its command line for the MLflow run: not for later tests in this process
    monkeypatch.setattr(tracking_driver, "_invoked", [])


def _fuzz(examples: int) -> settings:
    """Reproducible in CI (derandomize), no example database written into the checkout."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# --- the schema's keys, per workload family ----------------------------------------------------


def _leaves(schema: type, prefix: str) -> dict[str, Any]:
    """Dotted key → type hint of every setting under a section dataclass."""
    hints = typing.get_type_hints(schema)
    keys: dict[str, Any] = {}
    for field in dataclasses.fields(schema):
        key = f"{prefix}.{field.name}" if prefix else field.name
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            keys |= _leaves(hint, key)
        else:
            keys[key] = hint
    return keys


_COMMON = {k: v for k, v in _leaves(Recipe, "").items() if not k.startswith("workload")}
SCHEMA = {
    "cnn": _COMMON | _leaves(CNNWorkloadConfig, "workload"),
    "sbi": _COMMON | _leaves(SBIWorkloadConfig, "workload"),
}
# Choices that live in registries, not in Literal types: valid values worth drawing.
NAMES = {
    "workload.model": [*KNOWN_MODELS, "torchvision:resnet18", "torchvision:"],
    "workload.dataset": list(KNOWN_DATASETS),
    "workload.task": list(KNOWN_TASKS),
    "workload.estimator.model": list(ESTIMATORS),
    "workload.kind": ["cnn", "sbi"],
}


def _family(path: Path) -> str:
    return str(DOCS[path]["workload"]["kind"])


# A shipped recipe, each family drawn as often as the other (SBI ships more recipes, and they
# are the slower ones to load).
RECIPES = st.sampled_from(sorted(SCHEMA)).flatmap(
    lambda family: st.sampled_from([p for p in SHIPPED if _family(p) == family])
)


# --- values as typed after `key=` --------------------------------------------------------------

SPECIALS = [
    "", "~", "null", "None", ".nan", "nan", ".inf", "-.inf", "inf", "1e400", "-1e400", "0", "-0",
    "-1", "1.5", "-1.5", "0.0", "1e-320", str(2**64), str(-(2**64)), str(2**31), "true", "false",
    "yes", "off", "[]", "{}", "[1, 2]", "{a: 1}", "[1,2", "{a: 1", "]", "}", "[[]]",
    "{CPU: -1}", "{GPU: .nan}", "{a: {b: c}}", "${nowhere}", "${train.lr}", "${run.name}",
    "${workload}", "${train}", "${oc.env:TRAINFORGE_FUZZ_UNSET}", "${oc.env:HOME}",
    "${oc.env:TRAINFORGE_FUZZ_NOT_UTF8}",
    "${oc.decode:'[1'}", "${no_such_resolver:x}", "${", "$", "\\${nowhere}", "a=b", "=", "'q'",
    '"unterminated', "!!python/object/apply:os.getcwd []", "!!binary aGk=", "&a 1", "*a", "- x",
    ": x", "#c", "%YAML 1.2", "@", "`", "|", ">", "0x10", "1_000", "+5", ".5", "2020-01-01",
    "12:30", "x" * 300, " ", "\t", "a\nb", "\udcff", "/", "..", ".", "a/b", "s3://bucket/x",
]  # fmt: skip
TEXT = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00")  # argv has no NUL
    | st.sampled_from("\udc80\udcff${}[]=.:,'\"\\ \n"),  # …but bytes a UTF-8 locale cannot read
    max_size=12,
)


def _number(value: float) -> str:
    """A float as YAML writes it (``.nan``, ``-.inf``; Python's ``nan`` is a string to YAML)."""
    if math.isnan(value):
        return ".nan"
    return repr(value) if math.isfinite(value) else ("-.inf" if value < 0 else ".inf")


# Boundaries worth more than their share of draws: signs, zero, what int32/int64/uint32 hold.
EDGE_INTS = [-1, 0, 1, 2, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, -(2**63) - 1, 10**30]
FLOATS = st.floats().map(_number) | st.sampled_from(["0.0", "-0.0", "1e-300", "1.0", "0.999"])


def _typed(hint: Any, key: str) -> st.SearchStrategy[str]:
    """Values of about the right type for ``hint`` (in and out of range)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if key in NAMES:
        return st.sampled_from(NAMES[key])
    if origin is typing.Literal:
        return st.sampled_from([str(a) for a in args] + [str(args[0]).upper(), "true", "auto"])
    if type(None) in args:  # Optional: the other type, or null
        (inner,) = [a for a in args if a is not type(None)]
        return _typed(inner, key) | st.just("null")
    if hint is bool:
        return st.sampled_from(["true", "false", "True", "1", "0"])
    if hint is int:
        return st.one_of(
            st.sampled_from(EDGE_INTS), st.integers(-3, 100), st.integers(-(2**70), 2**70)
        ).map(str)
    if hint is float:
        return FLOATS | st.integers(-3, 100).map(str)
    if origin is list:
        items = st.lists(st.integers(-2, 12) | st.sampled_from(EDGE_INTS), max_size=3)
        return items.map(lambda xs: f"[{', '.join(map(str, xs))}]")
    if origin is dict:
        entry = st.tuples(st.sampled_from(["CPU", "GPU", "memory", "x"]), FLOATS)
        entries = st.lists(entry, max_size=2)
        return entries.map(lambda es: "{" + ", ".join(f"{k}: {v}" for k, v in es) + "}")
    return TEXT


def _value(hint: Any, key: str) -> st.SearchStrategy[str]:
    """Half of the draws of about the right type, the rest anything."""
    return _typed(hint, key) | (st.sampled_from(SPECIALS) | TEXT)


# --- keys: from the schema, misspelt, misplaced ------------------------------------------------


def _typo(key: str) -> st.SearchStrategy[str]:
    def mutate(data: tuple[int, str, int]) -> str:
        where, char, how = data
        i = where % (len(key) + 1)
        return [key[:i] + char + key[i:], key[:i] + key[i + 1 :], key.upper(), key + char][how]

    return st.tuples(st.integers(0, 99), st.sampled_from("abz_.[]0 "), st.integers(0, 3)).map(
        mutate
    )


def _bad_keys(family: str) -> st.SearchStrategy[str]:
    """Keys a user could type for a setting and get wrong."""
    schema = sorted(SCHEMA[family])
    sections = sorted({k.split(".")[0] for k in schema})
    ident = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
    known = st.sampled_from(schema)
    return st.one_of(
        known.flatmap(_typo),
        st.tuples(ident, ident).map(".".join),  # an unknown section
        st.tuples(known, ident).map(".".join),  # a setting nested under a setting
        st.tuples(st.sampled_from(sections), known).map(  # the right leaf in the wrong section
            lambda sk: f"{sk[0]}.{sk[1].rsplit('.', 1)[-1]}"
        ),
        st.sampled_from([k.rsplit(".", 1)[-1] for k in schema]),  # a leaf without its section
        st.sampled_from(sections),  # a whole section
        known.map(lambda k: k.replace(".", "..", 1)),
        known.map(lambda k: f"+{k}"),
        known.map(lambda k: f"~{k}"),
        known.map(lambda k: f"{k}[0]"),
        st.sampled_from(["", ".", "train.", ".lr", "0", "train.0", "${x}", "a\\=b", "tr ain.lr"]),
        TEXT.filter(lambda k: not k.startswith("-")),  # `-…` is an option to argparse
    )


# --- running the command ------------------------------------------------------------------------


@dataclasses.dataclass
class Ran:
    code: int
    out: str
    err: str


def _cli(*argv: str) -> Ran:
    """``trainforge <argv>`` in-process, with stdout and stderr encoded as a UTF-8 console
    encodes them (stdout strict, stderr backslashreplace: Python's own defaults)."""
    ray_before = _ray_running()
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    # (a `ray` test before this one in the same process may hold the shared local Ray)
    assert _ray_running() == ray_before, "Ray was started"
    err.flush()
    texts = [stream.buffer.getvalue().decode() for stream in (out, err)]  # type: ignore[attr-defined]
    return Ran(code, *texts)


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _refusal(ran: Ran) -> str:
    """The one error line of a refused command, without its prefix."""
    assert ran.code == 2, ran
    assert ran.out == "", ran  # nothing printed as if the recipe were fine
    assert ran.err.startswith(ERROR) and ran.err.count("\n") == 1, ran.err
    return ran.err.removeprefix(ERROR).rstrip("\n")


def _named_key(message: str) -> str:
    return message.split(": ", 1)[0]


def _related(named: str, keys: set[str]) -> bool:
    """The named key is one of ``keys``, a section above one, or a setting under one (keys
    as a refusal shows them: control characters escaped)."""
    keys = {cli._one_line(key) for key in keys}
    return any(
        named == key or key.startswith(named + ".") or named.startswith(key + ".") for key in keys
    )


def _interpolations(doc: Any, prefix: str = "") -> dict[str, set[str]]:
    """key → keys it interpolates (``${…}``), both ways round."""
    links: dict[str, set[str]] = {}
    items = doc.items() if isinstance(doc, dict) else []
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, dict):
            for a, bs in _interpolations(value, key).items():
                links.setdefault(a, set()).update(bs)
        for target in re.findall(r"\$\{([\w.]+)\}", str(value)):
            links.setdefault(key, set()).add(target)
            links.setdefault(target, set()).add(key)
    return links


# Cross-key rules: a value of the first key can make the recipe's other keys wrong.
CROSS = {
    "workload.kind": {"workload"},  # another family: the section's other settings are unknown
    "workload.task": {"workload.prior", "workload.simulator", "workload.prior/simulator"},
    "workload.prior": {"workload.prior/simulator"},
    "workload.simulator": {"workload.prior/simulator"},
    "precision.dtype": {"precision.cuda_graphs"},
    "precision.compile": {"precision.cuda_graphs"},
    "train.grad_accum_steps": {"precision.cuda_graphs", "train.batch_size"},
    "scaling.use_gpu": {"precision.cuda_graphs", "scaling.resources_per_worker.GPU"},
    "scaling.num_workers": {"train.batch_size"},
    "workload.simulation.num_simulations": {"train.batch_size"},
    "workload.val_fraction": {"train.batch_size"},
    "workload.synthetic_train_size": {"train.batch_size"},
    "workload.dataset": {"workload.model", "train.batch_size"},
    "workload.estimator.embedding": {"workload.estimator.embedding_input_shape"},
}


def _names_the_key(message: str, key: str, value: str, base: dict[str, Any], item: str) -> bool:
    """Does the refusal name the override's key (or the key it leads to)?"""
    if repr(item) in message:  # an override that cannot be parsed is quoted whole
        return True
    links = _interpolations(base)
    keys = {key, *links.get(key, ()), *CROSS.get(key, ())}
    keys |= set(re.findall(r"\$\{([\w.]+)\}", value))  # the key a value interpolates
    named = _named_key(message)
    mentioned = re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message)
    return _related(named, keys) or mentioned is not None


def _loads_again_the_same(ran: Ran, workdir: Path) -> None:
    """What validate printed is the resolved recipe: loading it gives it back unchanged (what
    validate would print again), and the workers' constructors accept its values."""
    assert ran.err.count(ERROR) == 0 and "Traceback" not in ran.err, ran.err
    printed = workdir / "resolved.yaml"
    printed.write_text(ran.out, encoding="utf-8")
    again = config.load(printed)
    assert config.to_yaml(again) == ran.out
    _workers_accept(again)


def _workers_accept(cfg: Recipe) -> None:
    """The values a loaded recipe hands its workers are ones their constructors take: finite
    numbers, a seed every RNG takes, an optimizer torch builds, a timeout a timedelta holds, a
    run name that is one folder in the storage (and its lock file a file name)."""
    import numpy as np
    import torch
    from sklearn.model_selection import train_test_split

    from trainforge.optim import build_optimizer, build_schedule
    from trainforge.worker.rng import seed_everything
    from trainforge.workloads.sbi.simulating import chunk_seed

    def finite(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for name, child in node.items():
                finite(child, f"{key}.{name}")
        elif isinstance(node, float):
            assert math.isfinite(node), f"{key} = {node} loaded"

    finite(config.to_container(cfg), "recipe")
    seed_everything(cfg.run.seed + cfg.scaling.num_workers - 1)  # the last rank's seed
    chunk_seed(cfg.run.seed, 0)
    train_test_split(np.arange(10), test_size=0.5, random_state=cfg.run.seed)  # digits' split
    model = torch.nn.Linear(1, 1)
    build_schedule(build_optimizer(model, cfg.train), cfg.train, total_steps=10)
    datetime.timedelta(seconds=cfg.scaling.timeout_s)  # Ray's TorchConfig makes one
    run_dir = os.path.normpath(os.path.join("/storage", cfg.run.name))
    assert os.path.dirname(run_dir) == "/storage" and "\x00" not in run_dir, run_dir
    assert len(os.fsencode(f".{cfg.run.name}.lock")) <= 255  # the run lock, beside the folder


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh working directory per example (relative storage paths land in it)."""
    before = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="recipe-fuzz-") as folder:
        os.chdir(folder)
        try:
            yield Path(folder)
        finally:
            os.chdir(before)


# --- overrides -----------------------------------------------------------------------------------


@st.composite
def _setting_and_value(draw: st.DrawFn) -> tuple[Path, str, str]:
    """A shipped recipe, one of its family's settings, and a value for it."""
    path = draw(RECIPES)
    family = _family(path)
    key = draw(st.sampled_from(sorted(SCHEMA[family])))
    return path, key, draw(_value(SCHEMA[family][key], key))


@st.composite
def _bad_key_and_value(draw: st.DrawFn) -> tuple[Path, str, str]:
    path = draw(RECIPES)
    key = draw(_bad_keys(_family(path)))
    return path, key, draw(st.sampled_from(SPECIALS) | TEXT | FLOATS)


def _one_override(path: Path, key: str, value: str) -> None:
    """Loads (and then again the same), or one error line naming the key."""
    item = f"{key}={value}"
    key, value = item.split("=", 1)  # a drawn key may hold a `=` itself
    with _scratch() as workdir:
        ran = _cli("validate", str(path), item)
        assert ran.code in (0, 2), ran
        assert "Traceback" not in ran.out + ran.err
        if ran.code == 0:
            _loads_again_the_same(ran, workdir)
            return
        message = _refusal(ran)
        assert _names_the_key(message, key, value, DOCS[path], item), (item, message)


# Found by these tests; each was a traceback, a worker that would crash, or a value that loaded
# and was garbage. (recipe, key, value)
@example((DIGITS, "train.lr", "[1,2"))  # a YAML ParserError traceback
@example((DIGITS, "scaling.resources_per_worker", "[1]"))  # TypeError from OmegaConf's merge
@example((SBI_DEBUG, "workload.evaluation.observations", "{a: 1}"))  # the same
@example((SBI_DEBUG, "workload.evaluation.observations", "[[1]]"))  # TypeError in a check
@example((DIGITS, "scaling.resources_per_worker", "{a: [1]}"))  # the same
@example((DIGITS, "scaling.resources_per_worker", "${oc.env:HOME}"))  # error naming no key
@example((DIGITS, "workload.kind", "${x}"))  # InterpolationKeyError traceback
@example((DIGITS, "train.weight_decay", ".nan"))  # loaded: NaN passes every comparison
@example((DIGITS, "train.momentum", ".nan"))  # loaded
@example((DIGITS, "scaling.resources_per_worker", "{CPU: .nan}"))  # loaded
@example((DIGITS, "train.momentum", "-1"))  # loaded; torch's SGD refuses it in the worker
@example((DIGITS, "run.seed", "-1"))  # loaded; the digits split and SBI chunk seeds refuse it
@example((DIGITS, "run.seed", str(2**64)))  # loaded; torch.manual_seed overflows
@example((DIGITS, "scaling.timeout_s", str(10**14)))  # loaded; Ray's timedelta overflows
@example((SBI_DEBUG, "workload.estimator.embedding_input_shape", f"[{2**63}]"))  # torch overflow
@example((DIGITS, "tracking.experiment", "${oc.env:TRAINFORGE_FUZZ_NOT_UTF8}"))  # print fails
@example((SBI_DEBUG, "workload.estimator.embedding_input_shape", "\\${x}"))  # traceback
@example((DIGITS, "run.name", "\\${x}"))  # loaded as '${x}'; printed, it no longer loads
@example((DIGITS, "run.name", ".."))  # loaded: the run folder would be the storage's parent
@example((DIGITS, "run.name", '"a\\0b"'))  # loaded; `train` failed on a NUL in a path
@example((DIGITS, "run.name", "x" * 250))  # loaded; `train` failed: lock name too long
@example((SBI_DEBUG, "workload.estimator.model_kwargs", "[]"))  # TypeError from the merge
@example((DIGITS, "workload.dataset_kwargs", "1"))  # the same
@_fuzz(250)
@given(_setting_and_value())
def test_a_setting_with_any_value_loads_or_is_refused_naming_it(
    case: tuple[Path, str, str],
) -> None:
    _one_override(*case)


@example((DIGITS, "[y", "1"))  # IndexError from OmegaConf's key grammar
@example((DIGITS, "x", "\x05"))  # a YAML ReaderError traceback
@example((DIGITS, "x", "\udcff"))  # argv bytes that are not UTF-8: no key named
@example((DIGITS, "workload", "${x}"))  # traceback
@example((DIGITS, "train", "${run}"))  # error naming no key
@_fuzz(100)
@given(_bad_key_and_value())
def test_a_wrong_key_is_refused_naming_it(case: tuple[Path, str, str]) -> None:
    _one_override(*case)


@_fuzz(80)
@given(
    RECIPES.flatmap(
        lambda path: st.tuples(
            st.just(path),
            st.lists(
                st.tuples(
                    st.sampled_from(sorted(SCHEMA[_family(path)])) | _bad_keys(_family(path)),
                    st.sampled_from(SPECIALS) | TEXT | FLOATS,
                ),
                max_size=4,
            ),
        )
    )
)
def test_several_overrides_load_or_are_refused_naming_one(
    case: tuple[Path, list[tuple[str, str]]],
) -> None:
    path, pairs = case
    items = [f"{k}={v}" for k, v in pairs]
    with _scratch() as workdir:
        ran = _cli("validate", str(path), *items)
        assert ran.code in (0, 2), ran
        if ran.code == 0:
            _loads_again_the_same(ran, workdir)
            return
        message = _refusal(ran)
        named = [_names_the_key(message, *i.split("=", 1), DOCS[path], i) for i in items]
        assert any(named), (items, message)


# --- whole recipe files ---------------------------------------------------------------------------

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EDGE_INTS) | st.integers(-3, 100),
    st.floats(),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=8),  # NUL and controls too
    st.sampled_from(SPECIALS),
    st.lists(st.integers(-2, 3) | st.text(max_size=2), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-2, 3) | st.none(), max_size=2),
)
NEW_KEYS = st.one_of(
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
    st.sampled_from([0, 1.5, True, "", "a.b", "${x}", "lr ", "Train", "x" * 300, "a\nb"]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=5),
)


def _key_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths: list[tuple[Any, ...]] = []
    for name, value in doc.items() if isinstance(doc, dict) else []:
        paths.append((*prefix, name))
        paths += _key_paths(value, (*prefix, name))
    return paths


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


@st.composite
def _mutated_recipe(draw: st.DrawFn) -> tuple[Path, str, set[str]]:
    """A shipped recipe with a key dropped, a value replaced, or a key added — written as YAML
    — and the keys a refusal may name."""
    path = draw(RECIPES)
    doc = yaml.safe_load(path.read_text())
    where = draw(st.sampled_from(_key_paths(doc)))
    parent = doc
    for name in where[:-1]:
        parent = parent[name]
    how = draw(st.sampled_from(["drop", "replace", "add"]))
    if how == "drop":
        del parent[where[-1]]
    elif how == "replace":
        parent[where[-1]] = draw(JUNK)
    else:
        container = parent[where[-1]]
        if not isinstance(container, dict):  # beside a setting, not under it
            container, where = parent, where[:-1]
        new = draw(NEW_KEYS)
        container[new] = draw(JUNK)
        where = (*where, new)
    named = {_dotted(where)} | {_dotted(where[:i]) for i in range(1, len(where))}
    named |= _interpolations(DOCS[path]).get(_dotted(where), set())
    named |= CROSS.get(_dotted(where), set())
    return path, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), named


def _validate_file(text: str) -> tuple[str, str] | None:
    """``trainforge validate`` on ``text`` as a recipe file: None when it loads (and its printed
    YAML loads again the same), else the file's path and the one line refusing it (exit 2)."""
    with _scratch() as workdir:
        recipe = workdir / "recipe.yaml"
        recipe.write_text(text, encoding="utf-8")
        ran = _cli("validate", str(recipe))
        assert ran.code in (0, 2), ran
        if ran.code == 0:
            _loads_again_the_same(ran, workdir)
            return None
        return str(recipe), _refusal(ran)


@example((DIGITS, "run:\n  name: x\n  ? 'a\n\n    b'\n  : 1\n", {"run.a\nb"}))  # 2 lines
@_fuzz(120)
@given(_mutated_recipe())
def test_a_mutated_recipe_file_loads_or_is_refused_naming_the_key(
    case: tuple[Path, str, set[str]],
) -> None:
    _, text, named = case
    refused = _validate_file(text)
    if refused is not None:
        recipe, message = refused
        assert _related(_named_key(message), named) or recipe in message, (named, message)


SNIPPETS = [
    ":", ": :", "- ", "  ", "\t", "[", "{", "}", "]", '"', "'", "&a ", "*b", "!!int ", "%", "@",
    "`", "\n", "? ", "<<: *x", "#", "\\", "\x00", "\x85", "\ufeff", "---\n", "...\n", "|\n",
]  # fmt: skip


@st.composite
def _broken_text(draw: st.DrawFn) -> str:
    """A shipped recipe's text with a snippet inserted, a span cut out, or a line duplicated."""
    text = draw(RECIPES).read_text()
    at = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["insert", "cut", "duplicate"]))
    if how == "insert":
        return text[:at] + draw(st.sampled_from(SNIPPETS)) + text[at:]
    if how == "cut":
        return text[:at] + text[at + draw(st.integers(1, 12)) :]
    lines = text.splitlines(keepends=True)
    line = at % len(lines)
    return "".join(lines[: line + 1] + lines[line:])


@_fuzz(80)
@given(_broken_text())
@example("run:\n  name: x\ntrain:\n  optimizer: !!int sgd\n")  # a tag YAML cannot apply
def test_a_recipe_with_broken_yaml_is_refused_at_its_line(text: str) -> None:
    refused = _validate_file(text)
    if refused is None:
        return
    recipe, message = refused
    syntax = re.match(rf"recipe {re.escape(recipe)}:(\d+):(\d+): YAML syntax error: ", message)
    if syntax:
        assert 1 <= int(syntax[1]) <= text.count("\n") + 2, message
        return
    # Still YAML, with other meaning: the refusal names a key of what it now says, a key of the
    # schema, or the file.
    try:  # as OmegaConf reads it (its YAML loader takes a tab inside a key)
        keys = {_dotted(p) for p in _key_paths(OmegaConf.to_container(OmegaConf.create(text)))}
    except (yaml.YAMLError, OmegaConfBaseException, ValueError):  # `!!int sgd`: ValueError
        keys = set()
    keys |= set(SCHEMA["cnn"]) | set(SCHEMA["sbi"])
    assert _related(_named_key(message), keys) or recipe in message, message


# --- train: refused before Ray, or at the door of Ray holding nothing ---------------------------


NAME_PART = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="/\x00") | st.just("\udcff"),
    min_size=1,
    max_size=8,
)
PLAIN = st.from_regex(r"[\w.-]{1,12}", fullmatch=True)
NAMES_FOR_RUNS = st.one_of(
    PLAIN, st.sampled_from(["ok", ".", "..", "x" * 201, "a/b", " ", "-", "~"]), NAME_PART
)
STORAGE = st.one_of(
    st.lists(PLAIN.filter(lambda part: part.strip(".")), min_size=1, max_size=3).map("/".join),
    st.lists(NAME_PART.filter(lambda p: p.strip(".") and p[0] != "~"), max_size=3).map("/".join),
    st.sampled_from(["", ".", "./runs", "{here}/abs", "s3://bucket/runs", "a-file", "a-file/runs"]),
)


FINE = ("train.lr", "0.1")  # a setting that changes nothing that matters here


@example(recipe=DIGITS, name="x" * 250, storage="", setting=FINE)  # OSError: lock name
@example(recipe=DIGITS, name='"a\\0b"', storage="", setting=FINE)  # ValueError: NUL
@example(recipe=DIGITS, name="ok", storage='"a\\0b"', setting=FINE)  # the same
@example(recipe=DIGITS, name="..", storage="", setting=FINE)  # reached Ray: run = parent
@_fuzz(50)
@given(
    recipe=RECIPES,
    name=NAMES_FOR_RUNS,
    storage=STORAGE,
    setting=st.just(FINE) | _setting_and_value().map(lambda case: case[1:]),
)
def test_train_refuses_before_ray_or_reaches_it_holding_nothing(
    recipe: Path, name: str, storage: str, setting: tuple[str, str]
) -> None:
    """`train` refuses what `validate` refuses, in the same words; beyond that only what this
    machine lacks (as `validate` noted it) or what the run's folder cannot be — else it gets to
    Ray. A run name, a storage path and one more setting; a lock never outlives the command."""
    key, value = setting
    with _scratch() as workdir:
        (workdir / "a-file").write_text("storage_path cannot be a folder here\n")
        storage = storage.replace("{here}", str(workdir))
        items = [f"run.name={name}", f"run.storage_path={storage}", f"{key}={value}"]
        checked = _cli("validate", str(recipe), *items)
        try:
            ran = _cli("train", str(recipe), *items)
        except _ReachedRay:  # every check before workers passed: Ray would start now
            ran = None
        assert not list(workdir.rglob(".*.lock")), "a lock outlived its command"
        note = re.search(r"^# note: `train` would refuse on this machine: (.*)$", checked.err, re.M)
        if checked.code == 2:
            assert ran is not None and ran.err == checked.err, (ran, checked)
        elif ran is not None:  # what this machine lacks: the data validate noted, or a folder
            message = _refusal(ran)
            noted = note is not None and message == cli._one_line(note[1])
            assert noted or _named_key(message) == "run.storage_path", (message, note)
        else:
            assert note is None, note  # the data it lacks would have stopped `train`
