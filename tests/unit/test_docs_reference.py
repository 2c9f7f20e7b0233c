"""The reference pages under docs/reference/ are what ``trainforge.docs_reference`` makes from the
code now (recipe keys from the schema, settings, the command line), and what they hold comes
from the code: every recipe key with a meaning, every setting, every command and flag."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from trainforge import cli, docs_reference, settings
from trainforge.config.rules import Section
from trainforge.config.schema import Recipe, TrainSection, WorkloadSection
from trainforge.workloads import FAMILIES, spec_for

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return docs_reference.pages()


def test_the_committed_pages_are_what_the_code_makes(pages: dict[str, str]) -> None:
    stale = [path for path, text in pages.items() if _read(DOCS / path) != text]
    assert not stale, (
        f"docs/{', docs/'.join(stale)} differ from the code: run `{docs_reference.COMMAND}` "
        "in the repository's root and commit the pages it writes"
    )


def test_every_recipe_key_is_listed_with_a_meaning(pages: dict[str, str]) -> None:
    """A field without the docstring under it would leave its row without a meaning."""
    text = pages["reference/recipe-keys.md"]
    hints = typing.get_type_hints(Recipe)
    sections = [(hints[field.name], field.name) for field in dataclasses.fields(Recipe)
                if not issubclass(hints[field.name], WorkloadSection)]  # fmt: skip
    sections += [(spec_for(kind).schema, "workload") for kind in FAMILIES]
    missing, count = [], 0
    for cls, key in _with_nested(sections):
        meanings = docs_reference.field_docstrings(cls)
        for field in dataclasses.fields(cls):
            if _is_section(cls, field.name):
                continue
            count += 1
            assert f"| `{key}.{field.name}` |" in text, f"{key}.{field.name}"
            if not meanings.get(field.name):
                missing.append(f"{cls.__module__}.{cls.__name__}.{field.name}")
    assert not missing, f"add a docstring under each of these fields: {missing}"
    assert count > 80  # every family's keys, the SBI section's nested ones too


def test_a_key_row_has_its_type_default_choices_and_meaning(pages: dict[str, str]) -> None:
    text = pages["reference/recipe-keys.md"]
    assert (
        "| `train.optimizer` | str | `adamw` | `adamw` \\| `adam` \\| `sgd` | adamw \\| adam \\| "
        "sgd. |" in text
    )
    assert "| `train.max_steps` | int or null | `null` |  |" in text
    assert "| `run.name` | str | *required* |" in text
    assert "| `workload.evaluation.observations` | list of int | `[1]` |" in text
    # a reST code span in a docstring becomes Markdown's; `<name>` stays text, not a tag
    assert "(`torch.backends.cudnn.benchmark`)" in text and "torchvision:&lt;name>" in text
    assert docs_reference.field_docstrings(TrainSection)["lr"] == "Peak learning rate."


def test_every_setting_and_command_is_on_its_page(pages: dict[str, str]) -> None:
    for setting in settings.SETTINGS:
        assert f"| `{setting.name}` |" in pages["reference/settings.md"]
    text = pages["reference/cli.md"]
    commands = docs_reference._subcommands(cli.parser())
    assert {"train", "validate", "ui", "cluster", "submit"} <= set(commands)
    for name, (parser, _) in commands.items():
        assert f"\n## {name}\n" in text and f"trainforge {name} [-h] [-q | -v]" in text
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "-q", "-v", "--help", "--quiet", "--verbose"):
                    assert f"`{flag}`" in text, f"{name} {flag}"


def test_check_names_a_stale_page_and_the_command_rewrites_it(tmp_path: Path, capsys) -> None:
    assert docs_reference.main(["--docs", str(tmp_path)]) == 0
    assert docs_reference.main(["--docs", str(tmp_path), "--check"]) == 0
    page = tmp_path / "reference" / "settings.md"
    page.write_text(page.read_text() + "edited by hand\n")
    assert docs_reference.main(["--docs", str(tmp_path), "--check"]) == 1
    said = capsys.readouterr().err
    assert f"{page} is stale: run python -m trainforge.docs_reference" in said
    assert docs_reference.main(["--docs", str(tmp_path)]) == 0
    assert docs_reference.stale(tmp_path) == []


def _with_nested(sections: list[tuple[type, str]]) -> list[tuple[type, str]]:
    found = []
    for cls, key in sections:
        found.append((cls, key))
        for field in dataclasses.fields(cls):
            if _is_section(cls, field.name):
                found += _with_nested([(_hint(cls, field.name), f"{key}.{field.name}")])
    return found


def _is_section(cls: type, name: str) -> bool:
    hint = _hint(cls, name)
    return isinstance(hint, type) and issubclass(hint, Section)


def _hint(cls: type, name: str) -> object:
    return typing.get_type_hints(cls)[name]


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None
