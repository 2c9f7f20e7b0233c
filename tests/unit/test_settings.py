"""Every ``TRAINFORGE_*`` setting in one place (``trainforge.settings``): where a local command's
workers run, by ``TRAINFORGE_WORKERS``'s named values; a value that is none of them refused in
one line naming the setting; the docs' table made from the declarations."""

from __future__ import annotations

import pytest

from trainforge import settings
from trainforge.errors import RecipeError

# TRAINFORGE_WORKERS → (own processes where no cluster is used, the lasting cluster, warm pool)
WHERE = {
    "auto": (True, True, True),
    "own": (True, False, False),
    "warm": (False, True, True),
    "ray-train": (False, True, False),
    "private": (False, False, False),
}


@pytest.mark.parametrize("value", [None, *WHERE])
def test_each_named_value_says_where_a_local_commands_workers_run(
    value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv(settings.WORKERS.name, raising=False)
    else:
        monkeypatch.setenv(settings.WORKERS.name, f" {value} ")  # as a shell may leave it
    expected = WHERE[value or "auto"]
    assert (settings.own_processes(), settings.keeps_cluster(), settings.warm_pool()) == expected


def test_a_value_that_is_not_one_of_the_choices_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(settings.WORKERS.name, "0")
    with pytest.raises(RecipeError) as refused:
        settings.keeps_cluster()
    assert str(refused.value) == (
        "TRAINFORGE_WORKERS: '0' is not one of auto, own, warm, ray-train, private"
    )
    monkeypatch.setenv(settings.WARM_IDLE_S.name, "ten")
    with pytest.raises(RecipeError, match="TRAINFORGE_WARM_IDLE_S: 'ten' is not one of a number"):
        settings.WARM_IDLE_S.seconds()


def test_the_home_and_the_plugins_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv(settings.HOME.name, raising=False)
    assert str(settings.home()).endswith("/.cache/trainforge")
    monkeypatch.setenv(settings.HOME.name, str(tmp_path))
    assert str(settings.home()) == str(tmp_path)
    monkeypatch.setenv(settings.WORKER_PLUGINS.name, "tests.faults, my.profiler,")
    assert settings.worker_plugins() == ("tests.faults", "my.profiler")


def test_the_docs_table_lists_every_setting_with_its_default_and_meaning() -> None:
    table = settings.table().splitlines()
    assert table[:2] == ["| setting | default | meaning |", "|---|---|---|"]
    assert len(table) == 2 + len(settings.SETTINGS)
    names = [setting.name for setting in settings.SETTINGS]
    assert len(set(names)) == len(names) and all(n.startswith("TRAINFORGE_") for n in names)
    assert "| `TRAINFORGE_WORKERS` | `auto` | Where a local command's workers run." in table[3]
    assert table[-1].endswith("Set by trainforge. |")  # an ensemble member's parent run
