"""sbibm's stored observations, true parameters and reference posterior samples, read from the
sbibm 1.1.0 wheel.

The sbibm benchmark (Lueckmann et al. 2021) scores every method at ten fixed observations per
task against 10,000 stored reference posterior samples; its published C2ST values are comparable
only at those observations. The files ship inside sbibm's wheel (MIT licence), as
``sbibm/tasks/<task>/files/num_observation_<k>/{observation.csv, true_parameters.csv,
reference_posterior_samples.csv.bz2}`` for k = 1..10, plus bernoulli_glm's design matrix. sbibm
itself cannot be installed beside sbi 0.27 (it pins sbi < 0.22), so the wheel is read as the zip
file it is and the package is never imported.

Where the files come from, first match wins:
1. ``workload.evaluation.sbibm_path``, then ``$TRAINFORGE_SBIBM``: the wheel file, or a folder
   holding ``sbibm/tasks/…`` (an unpacked wheel, a site-packages folder, a clone of sbibm) or
   the ``sbibm`` package folder itself;
2. the cached wheel, ``$TRAINFORGE_HOME/sbibm/`` (default ``~/.cache/trainforge/sbibm/``);
3. PyPI, once, through ``python -m pip download`` (so pip's own index, proxy and certificate
   settings apply), written into the cache atomically.
A wheel is used only when its sha256 is the one pinned here; a folder is taken as given.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainforge import atomic, settings
from trainforge.errors import RecipeError

if TYPE_CHECKING:  # torch only where the files are read into tensors (not the driver's checks)
    from torch import Tensor

VERSION = "1.1.0"
WHEEL = f"sbibm-{VERSION}-py2.py3-none-any.whl"
# sha256 of the wheel on PyPI (files.pythonhosted.org), checked on every use.
WHEEL_SHA256 = "12ecc6b4d327b92f9225f08faa6405e4274fb8e75943d86a53157d1b1bcfaf74"
PATH_ENV = settings.SBIBM.name
NUM_OBSERVATIONS = 10
NUM_REFERENCE_SAMPLES = 10_000

# This project's task name → sbibm's folder name (sbibm also has gaussian_linear_uniform, sir,
# lotka_volterra, slcp_distractors and bernoulli_glm_raw, which have no task here).
TASK_NAMES = {
    "two_moons": "two_moons",
    "gaussian_linear": "gaussian_linear",
    "gaussian_mixture": "gaussian_mixture",
    "slcp": "slcp",
    "bernoulli_glm": "bernoulli_glm",
}

HOW_TO_FIX = (
    f"set workload.evaluation.sbibm_path (or ${PATH_ENV}) to a copy of {WHEEL} "
    f"(`pip download --no-deps sbibm=={VERSION}`) or an unpacked one, "
    "or use workload.evaluation.observations_from=own (this project's seeded observations)"
)


class SbibmDataError(RecipeError):
    """sbibm's files are missing, unreachable or not the pinned ones (exit status 2)."""


@dataclass(frozen=True)
class SbibmData:
    """sbibm's stored files for the tasks in TASK_NAMES, from a wheel or a folder."""

    location: Path
    """The wheel, or the folder that holds ``tasks/`` (the ``sbibm`` package folder)."""

    def observation(self, task: str, number: int) -> Tensor:
        """x_obs of observation ``number`` (1..10), float32 ``[dim_x]``."""
        return self.table(task, number, "observation.csv")[0]

    def true_parameters(self, task: str, number: int) -> Tensor:
        """θ that generated observation ``number``, float32 ``[dim_theta]``."""
        return self.table(task, number, "true_parameters.csv")[0]

    def reference_samples(self, task: str, number: int) -> Tensor:
        """sbibm's 10,000 reference posterior samples at observation ``number``, float32
        ``[10000, dim_theta]``, in the stored order (an MCMC chain's, for slcp and
        bernoulli_glm: take a random subset, not the first rows, when fewer are wanted)."""
        return self.table(task, number, "reference_posterior_samples.csv.bz2")

    def design_matrix(self) -> Tensor:
        """bernoulli_glm's design matrix, float32 ``[100, 10]``: a column of ones and the
        stimulus lagged by 0..8 bins."""
        import torch

        raw = self._read(f"tasks/{TASK_NAMES['bernoulli_glm']}/files/design_matrix.pt")
        matrix = torch.load(io.BytesIO(raw), weights_only=True)
        if not isinstance(matrix, torch.Tensor):
            raise SbibmDataError(f"{self.location}: design_matrix.pt holds no tensor")
        return matrix

    def table(self, task: str, number: int, name: str) -> Tensor:
        """One stored CSV of observation ``number`` (``name``, e.g. bernoulli_glm's
        ``observation_raw.csv``, its spike train), float32 ``[rows, columns]``."""
        import torch

        if task not in TASK_NAMES:
            raise SbibmDataError(
                f"sbibm has no stored data for task {task!r}; it has {', '.join(TASK_NAMES)}"
            )
        if not 1 <= number <= NUM_OBSERVATIONS:
            raise SbibmDataError(
                f"sbibm's observations are numbered 1..{NUM_OBSERVATIONS}, got {number}"
            )
        raw = self._read(f"tasks/{TASK_NAMES[task]}/files/num_observation_{number}/{name}")
        if name.endswith(".bz2"):
            raw = bz2.decompress(raw)
        # a header line of column names, then one row per sample
        values = np.loadtxt(io.StringIO(raw.decode()), delimiter=",", skiprows=1, ndmin=2)
        return torch.from_numpy(values.astype(np.float32))

    def _read(self, relative: str) -> bytes:
        try:
            if self.location.is_dir():
                return (self.location / relative).read_bytes()
            with zipfile.ZipFile(self.location) as wheel:
                return wheel.read(f"sbibm/{relative}")
        except (OSError, KeyError) as exc:
            raise SbibmDataError(f"{self.location} lacks sbibm's {relative} ({exc})") from None


def open_data(path: str | None = None, *, sha256: str = WHEEL_SHA256) -> SbibmData:
    """sbibm's files from ``path`` (a wheel or folder), ``$TRAINFORGE_SBIBM``, the cache, or
    PyPI, in that order (see the module docstring)."""
    return SbibmData(locate(path, sha256=sha256))


def locate(path: str | None = None, *, sha256: str = WHEEL_SHA256) -> Path:
    """Where sbibm's files are: a checked wheel or a package folder. Fetches the wheel into
    the cache when no path is given and the cache has none."""
    given = path or given_path()
    if given is not None:
        key = "workload.evaluation.sbibm_path" if path else f"${PATH_ENV}"
        return _given(Path(given).expanduser(), key, sha256)
    cached = cache_dir() / WHEEL
    if cached.is_file():
        check_wheel(cached, sha256, "the cached wheel")
        return cached
    return fetch_wheel(cache_dir(), sha256=sha256)


def given_path() -> str | None:
    """``$TRAINFORGE_SBIBM``, when set."""
    return settings.SBIBM.get() or None


def cache_dir() -> Path:
    return settings.home() / "sbibm"


def check_wheel(path: Path, sha256: str, what: str) -> None:
    digest = _sha256(path)
    if digest != sha256:
        raise SbibmDataError(
            f"{what} {path} is not sbibm {VERSION}'s wheel: its sha256 is {digest}, "
            f"expected {sha256}"
        )


def fetch_wheel(folder: Path, *, sha256: str = WHEEL_SHA256) -> Path:
    """Download the wheel with pip into ``folder`` (checked, then renamed into place, so a
    crash or a concurrent fetch never leaves half a wheel under its name)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SbibmDataError(f"cannot create the sbibm cache {folder}: {exc}") from None
    target = folder / WHEEL
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--retries", "1", "--timeout", "20",
            "--dest", scratch, f"sbibm=={VERSION}",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        downloaded = Path(scratch) / WHEEL
        if done.returncode != 0 or not downloaded.is_file():
            lines = [line.strip() for line in (done.stderr or done.stdout).splitlines()]
            said = next((line for line in reversed(lines) if line), "no wheel written")
            raise SbibmDataError(
                f"sbibm's stored observations are not here and could not be downloaded "
                f"(pip download sbibm=={VERSION}: {said}); {HOW_TO_FIX}"
            )
        check_wheel(downloaded, sha256, "the downloaded file")
        with atomic.replacing(target) as temporary:
            shutil.move(downloaded, temporary)
    return target


def _given(path: Path, key: str, sha256: str) -> Path:
    if path.is_file():
        check_wheel(path, sha256, f"{key}:")
        return path.resolve()
    if path.is_dir():
        for package in (path / "sbibm", path):
            if (package / "tasks").is_dir():
                return package.resolve()
        raise SbibmDataError(
            f"{key}: {path} holds neither sbibm/tasks/ nor tasks/ (an unpacked {WHEEL}, or its "
            "sbibm folder)"
        )
    raise SbibmDataError(f"{key}: {path} does not exist; {HOW_TO_FIX}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
