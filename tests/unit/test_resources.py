"""Shipped files: the recipes folder and runtime env, and recipes found by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import resources
from trainforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in recipes folder, so the tests do not depend on which recipes ship today."""
    root = tmp_path / "shipped"
    for name, text in {
        "cnn/digits.yaml": "# Digits on two CPU workers,\n# more words\nrun:\n  name: d\n",
        "sbi/moons.yaml": "\n# Two moons.\nrun: {}\n",
        "sbi/plain.yaml": "run: {}  # no leading comment\n",
        "cnn/twin.yaml": "# a\n",
        "sbi/twin.yaml": "# b\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(resources, "recipes_dir", lambda: root)
    return root


def test_checkout_resources_are_the_top_level_folders() -> None:
    # the editable install runs from runtime/: the recipes and deploy folders beside it
    assert resources.recipes_dir() == REPO / "recipes"
    assert resources.default_runtime_env() == REPO / "deploy" / "runtime_env.yaml"
    assert resources.default_runtime_env().is_file()


def test_installed_resources_are_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "deploy").mkdir()
    monkeypatch.setattr(resources, "PACKAGE_DIR", tmp_path)
    assert resources.recipes_dir() == tmp_path / "recipes"
    assert resources.default_runtime_env() == tmp_path / "deploy" / "runtime_env.yaml"


def test_shipped_recipes_are_named_by_their_path_without_suffix(shipped: Path) -> None:
    recipes = resources.shipped_recipes()
    assert list(recipes) == ["cnn/digits", "cnn/twin", "sbi/moons", "sbi/plain", "sbi/twin"]
    assert recipes["sbi/moons"] == shipped / "sbi" / "moons.yaml"


def test_describe_is_the_first_comment_line(shipped: Path) -> None:
    assert resources.describe(shipped / "cnn" / "digits.yaml") == "Digits on two CPU workers"
    assert resources.describe(shipped / "sbi" / "moons.yaml") == "Two moons."
    assert resources.describe(shipped / "sbi" / "plain.yaml") == ""


def test_every_real_shipped_recipe_has_a_description() -> None:
    recipes = resources.shipped_recipes()
    assert "cnn/digits_simple_cnn" in recipes
    assert all(resources.describe(path) for path in recipes.values()), recipes


@pytest.mark.parametrize(
    "given", ["cnn/digits", "digits", "cnn/digits.yaml", "recipes/cnn/digits.yaml"]
)
def test_find_recipe_by_name(
    shipped: Path, given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no such files here: names, not paths
    assert resources.find_recipe(given) == (shipped / "cnn" / "digits.yaml", "cnn/digits")


def test_an_existing_path_wins_over_a_name(
    shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "project" / "cnn" / "digits.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("# mine\n")
    monkeypatch.chdir(tmp_path / "project")
    assert resources.find_recipe("cnn/digits.yaml") == (Path("cnn/digits.yaml"), None)
    assert resources.find_recipe(str(own)) == (own, None)


def test_unknown_name_suggests_the_closest(shipped: Path) -> None:
    with pytest.raises(RecipeError, match=r"digts.*no such file.*did you mean 'digits'"):
        resources.find_recipe("digts")
    with pytest.raises(RecipeError, match=r"did you mean 'sbi/moons'"):
        resources.find_recipe("sbi/moon")


def test_a_part_of_a_name_lists_the_recipes_holding_it() -> None:
    with pytest.raises(RecipeError, match=r"recipe digits: .*did you mean 'cnn/digits_simple_cnn'"):
        resources.find_recipe("digits")
    with pytest.raises(RecipeError) as refused:
        resources.find_recipe("two_moons")
    assert "those with 'two_moons' in their name: " in str(refused.value)
    assert "sbi/two_moons_debug, sbi/two_moons_fmpe_debug" in str(refused.value)  # sorted
    assert str(refused.value).count("sbi/two_moons_") == len(
        [name for name in resources.shipped_recipes() if "two_moons" in name]
    )


def test_a_short_name_in_two_folders_is_ambiguous(shipped: Path) -> None:
    with pytest.raises(RecipeError, match=r"ambiguous.*cnn/twin, sbi/twin"):
        resources.find_recipe("twin")
    assert resources.find_recipe("sbi/twin")[1] == "sbi/twin"
