"""Every command line that README.md and docs/getting-started.md show in a shell code block
(and every `$ ` prompt line of their other code blocks) is accounted for: each step of it either
runs here or is in EXEMPT with the reason it cannot, and a step that is neither fails the test.

The `trainforge …` steps run as shown, from a folder of their own holding the repository's
`recipes/` and a copy of its `examples/` (a checkout, as the pages assume; a `cd examples/x &&
trainforge …` runs in the copy's folder), on the command's own worker processes so that nothing
outlives them (TRAINFORGE_WORKERS=own). The test only appends what makes a run short (a few
optimizer steps, an SBI evaluation without C2ST or SBC); `trainforge ui` is left running until it
has said where the UI is, then stopped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.integration.mlflow_server import free_port
from trainforge.resources import find_recipe

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
SHELL = ("bash", "sh", "shell", "console")  # code blocks whose every line is a command
# What keeps each workload's run short; a page that shows another kind needs its own here.
SHORT = {
    "cnn": ["train.max_steps=2"],
    "python": ["train.max_steps=2"],
    "sbi": ["train.max_steps=2", "workload.evaluation.c2st=false",
            "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false"],
}  # fmt: skip
# The steps the pages show that this test does not run (a step starting with the key), and why.
EXEMPT = {
    "pip install ": "installs packages: the test runs where the suite's install put them",
    "(command -v chromium ": "installs Chromium and shellcheck for the suite, as root",
    "python -m pytest ": "runs the whole suite, of which this test is a part",
    "trainforge submit ": "needs a Ray cluster, shared storage and an MLflow server: "
    "tests/integration/test_job_submit.py submits to a local `ray start --head`",
    "ray job submit ": "needs a Ray cluster: tests/integration/test_job_submit.py runs "
    "`ray job submit` (through `trainforge submit`) against a local `ray start --head`",
    "kubectl ": "needs a Kubernetes cluster with KubeRay: tests/deploy/test_k8s_manifests.py "
    "checks the manifests against KubeRay's schemas",
    "sbatch ": "needs SLURM: tests/deploy/test_slurm.py runs the script with stand-in `srun` "
    "and `scontrol`",
}


def command_lines(text: str) -> list[str]:
    """The command lines of the text's code blocks: every line of a shell block, its `\\`
    continuations joined; in other blocks (a transcript) the lines after a `$ ` prompt, or
    starting with `trainforge`. Comments dropped."""
    found = []
    for info, block in FENCE.findall(text):
        shell = info.strip().split(" ")[0] in SHELL
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line.startswith("$ "):
                line = line[2:].strip()
            elif not (shell or re.match(r"trainforge(\s|$)", line)):
                continue
            if line:
                found.append(line)
    return found


def steps(line: str) -> list[str]:
    """The commands of a line: split at `&&`, `||` and `;` outside parentheses and quotes."""
    parts, current, depth, quote, i = [], "", 0, "", 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif depth == 0 and (line.startswith(("&&", "||"), i) or c == ";"):
            parts.append(current)
            current, i = "", i + (1 if c == ";" else 2)
            continue
        current += c
        i += 1
    return [p.strip() for p in [*parts, current] if p.strip()]


@dataclass
class Shown:
    """What a page's command lines hold: the `trainforge` steps to run (each with the folder a
    `cd` before it in its line names, else ""), the exempt steps by EXEMPT key, and the steps
    that are neither."""

    run: list[tuple[str, list[str]]] = field(default_factory=list)
    exempt: dict[str, list[str]] = field(default_factory=dict)
    unaccounted: list[str] = field(default_factory=list)


def shown(text: str) -> Shown:
    found = Shown()
    for line in command_lines(text):
        folder = ""
        for step in steps(line):
            exempt = next((key for key in EXEMPT if step.startswith(key)), None)
            if step.startswith("cd "):
                folder = step.removeprefix("cd ").strip()
            elif exempt is not None:
                found.exempt.setdefault(exempt, []).append(step)
            elif re.match(r"trainforge(\s|$)", step):
                found.run.append((folder, shlex.split(step)))
            else:
                found.unaccounted.append(step)
    return found


def shown_commands(text: str) -> list[tuple[str, list[str]]]:
    """The `trainforge` steps of the text's command lines that this test runs."""
    return shown(text).run


def _commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for page in PAGES:
        found += [
            shown for shown in shown_commands((ROOT / page).read_text()) if shown not in found
        ]
    return found


COMMANDS = _commands()


def test_every_command_line_runs_or_is_exempt_with_a_reason() -> None:
    pages = [shown((ROOT / page).read_text()) for page in PAGES]
    unaccounted = [step for page in pages for step in page.unaccounted]
    assert not unaccounted, (
        "commands the pages show that this test neither runs nor exempts (add the reason to "
        f"EXEMPT, or make them runnable): {unaccounted}"
    )
    used = {key for page in pages for key in page.exempt}
    assert used == set(EXEMPT), f"EXEMPT keys no page shows any more: {set(EXEMPT) - used}"
    assert {"kubectl ", "sbatch ", "ray job submit "} <= used


def test_the_pages_show_the_commands_a_user_starts_with() -> None:
    names = {(folder, " ".join(words)) for folder, words in COMMANDS}
    assert {("", "trainforge train recipes/cnn/digits_simple_cnn.yaml"), ("", "trainforge ui"),
            ("", "trainforge train two_moons_debug"),
            ("examples/wave", "trainforge train recipe.yaml")} <= names  # fmt: skip
    text = (
        "```bash\npip install x && trainforge train r.yaml a=1  # note\n```\n"
        "```\n$ trainforge recipes\n[trainforge] it's said\n"
        "$ cd ex/a && trainforge train b.yaml\n```\n"
        "```bash\n# a comment\nkubectl apply -f k.yaml\nray job submit --address A -- \\\n"
        "    python -m trainforge train r.yaml\n"
        "(command -v chromium && x || (apt-get y)) && make all\n```\n"
    )
    found = shown(text)
    assert found.run == [
        ("", ["trainforge", "train", "r.yaml", "a=1"]), ("", ["trainforge", "recipes"]),
        ("ex/a", ["trainforge", "train", "b.yaml"]),
    ]  # fmt: skip
    assert found.exempt == {
        "pip install ": ["pip install x"],
        "kubectl ": ["kubectl apply -f k.yaml"],
        "ray job submit ": ["ray job submit --address A -- python -m trainforge train r.yaml"],
        "(command -v chromium ": ["(command -v chromium && x || (apt-get y))"],
    }
    assert found.unaccounted == ["make all"]


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
