"""Every `trainforge …` command that README.md and docs/getting-started.md show in a code block
runs as shown, from a folder of its own holding the repository's `recipes/` and a copy of its
`examples/` (a checkout, as the pages assume; a `cd examples/x && trainforge …` runs in the
copy's folder), on the command's own worker processes so that nothing outlives it
(TRAINFORGE_WORKERS=own). The test only appends what makes a run short (a few optimizer steps,
an SBI evaluation without C2ST or SBC); `trainforge ui` is left running until it has said where
the UI is, then stopped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.mlflow_server import free_port
from trainforge.resources import find_recipe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
# What keeps each workload's run short; a page that shows another kind needs its own here.
SHORT = {
    "cnn": ["train.max_steps=2"],
    "python": ["train.max_steps=2"],
    "sbi": ["train.max_steps=2", "workload.evaluation.c2st=false",
            "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false"],
}  # fmt: skip


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """The `trainforge` commands of the text's fenced code blocks: a line of its own, after a
    `$ ` prompt, or one step of a `&&` chain; comments dropped. Each with the folder it runs in:
    the one a `cd` before it in its chain names, else "" (where the page's reader is)."""
    found = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            folder = ""
            for step in line.split("&&"):
                step = step.strip().removeprefix("$ ")
                if step.startswith("cd "):
                    folder = step.removeprefix("cd ").strip()
                if re.match(r"trainforge(\s|$)", step):
                    found.append((folder, shlex.split(step, comments=True)))
    return found


def _commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for page in PAGES:
        found += [
            shown for shown in shown_commands((ROOT / page).read_text()) if shown not in found
        ]
    return found


COMMANDS = _commands()


def test_the_pages_show_the_commands_a_user_starts_with() -> None:
    shown = {(folder, " ".join(words)) for folder, words in COMMANDS}
    assert {("", "trainforge train recipes/cnn/digits_simple_cnn.yaml"), ("", "trainforge ui"),
            ("", "trainforge train two_moons_debug"),
            ("examples/wave", "trainforge train recipe.yaml")} <= shown  # fmt: skip
    assert shown_commands("```bash\npip install x && trainforge train r.yaml a=1  # note\n```\n"
                          "$ trainforge validate r.yaml\n```\n$ trainforge recipes\n"
                          "[trainforge] it's said\n$ cd ex/a && trainforge train b.yaml\n```\n"
                          ) == [
        ("", ["trainforge", "train", "r.yaml", "a=1"]), ("", ["trainforge", "recipes"]),
        ("ex/a", ["trainforge", "train", "b.yaml"]),
    ]  # fmt: skip


def _named(folder: str, words: list[str]) -> str:
    return " ".join([f"cd {folder};"] * bool(folder) + words[1:])


@pytest.mark.parametrize(("folder", "words"), COMMANDS, ids=[_named(*c) for c in COMMANDS])
def test_a_command_the_pages_show_runs(folder: str, words: list[str], tmp_path: Path) -> None:
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("runs", "mlflow.db", "__pycache__"))  # fmt: skip
    tmp_path = tmp_path / folder  # where the page's reader runs it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TRAINFORGE_WORKERS="own")
    command = [sys.executable, "-m", "trainforge", *words[1:]]
    if words[1] == "ui":
        _ui_starts([*command, "--port", str(free_port())], tmp_path, env)
        return
    if words[1] == "train":
        command += SHORT[_kind(words[2], tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    if words[1] == "train":
        assert re.search(r"\[trainforge\] run '[^']+' finished in", said), said[-4000:]
    if words[1] == "validate":
        assert done.stdout.startswith("run:\n") and "# global batch: " in done.stderr, said


def _kind(recipe: str, folder: Path) -> str:
    """The workload kind of a recipe argument as the command in ``folder`` reads it (a path
    there, else a shipped recipe's name)."""
    path = folder / recipe if (folder / recipe).is_file() else find_recipe(recipe)[0]
    kind = yaml.safe_load(path.read_text())["workload"]["kind"]
    assert kind in SHORT, f"{recipe}: add what keeps a {kind} run short to SHORT"
    return kind


def _ui_starts(command: list[str], folder: Path, env: dict[str, str]) -> None:
    """The UI command says where it serves the store, and its server is still running then."""
    ui = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        assert ui.stdout is not None
        store, port = f"sqlite:///{folder.resolve()}/mlflow.db", command[-1]
        expected = f"MLflow UI for {store} at http://127.0.0.1:{port}"
        said = ""
        while expected not in said and (line := ui.stdout.readline()):
            said += line
        assert expected in said, said
        time.sleep(2)
        assert ui.poll() is None, said + ui.stdout.read()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # the command and the MLflow server it started
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
