"""Files that ship with trainforge: the recipes and the job runtime env.

An installed wheel holds them inside the package (``trainforge/recipes``,
``trainforge/deploy/runtime_env.yaml``, see pyproject.toml); an editable install of a checkout
imports the package from ``runtime/``, and they are the checkout's own top-level folders.

A shipped recipe can be named instead of given by path: ``cnn/digits_simple_cnn`` (its path
under the recipes folder, without ``.yaml``) or just ``digits_simple_cnn`` when that is unique.
A user installing the wheel has no ``recipes/`` folder of their own, so names are how they
reach the shipped recipes, and how `trainforge submit` names one for the cluster's own install.
"""

from __future__ import annotations

from pathlib import Path

from trainforge.errors import RecipeError, did_you_mean

PACKAGE_DIR = Path(__file__).resolve().parent
SUFFIX = ".yaml"


def shipped(name: str) -> Path:
    """The shipped folder ``name`` (``recipes`` or ``deploy``), installed or checked out."""
    installed = PACKAGE_DIR / name
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


def recipes_dir() -> Path:
    return shipped("recipes")


def default_runtime_env() -> Path:
    return shipped("deploy") / "runtime_env.yaml"


def shipped_recipes() -> dict[str, Path]:
    """Every shipped recipe by its full name (``cnn/digits_simple_cnn``), sorted."""
    root = recipes_dir()
    return {
        path.relative_to(root).with_suffix("").as_posix(): path
        for path in sorted(root.rglob(f"*{SUFFIX}"))
    }


def describe(path: Path) -> str:
    """The recipe's first comment line: recipes open with a comment saying what they are."""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            # the line may run on into the next one; a dangling comma reads as a typo in a table
            return text.lstrip("#").strip().rstrip(",;:")
        if text:
            break
    return ""


def find_recipe(recipe: str) -> tuple[Path, str | None]:
    """A recipe argument → its file and, when it names a shipped recipe, that full name.

    A path that exists wins over a name, so a user's own ``cnn/digits_simple_cnn.yaml`` is never
    silently replaced by the shipped one. The README's ``recipes/cnn/….yaml`` also works from
    outside a checkout: it names the shipped recipe the checkout would hold there.
    """
    given = Path(recipe)
    if given.is_file():
        return given, None
    recipes = shipped_recipes()
    key = recipe.removeprefix("recipes/").removesuffix(SUFFIX)
    if key in recipes:
        return recipes[key], key
    by_stem: dict[str, list[str]] = {}
    for name in recipes:
        by_stem.setdefault(name.rsplit("/", 1)[-1], []).append(name)
    matches = by_stem.get(key, [])
    if len(matches) == 1:
        return recipes[matches[0]], matches[0]
    if len(matches) > 1:
        raise RecipeError(f"recipe {recipe!r} is ambiguous: give one of {', '.join(matches)}")
    # a part of a name ("digits", "resnet", "two_moons"): the names holding it, for difflib may
    # find none close, or pick one of several
    holding = [name for name in recipes if key.lower() in name.lower()]
    if len(holding) > 1:
        hint = f" (those with {key!r} in their name: {', '.join(holding)})"
    else:
        hint = did_you_mean(key, [*recipes, *by_stem])
        if not hint and holding:
            hint = f" (did you mean '{holding[0]}'?)"
    raise RecipeError(
        f"recipe {recipe}: no such file, and no shipped recipe by that name{hint}; "
        "`trainforge recipes` lists them"
    )
