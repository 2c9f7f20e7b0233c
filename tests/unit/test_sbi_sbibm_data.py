"""sbibm's stored data (``sbibm_data``) and the choice of observations (``observations``),
against a tiny wheel built here with sbibm's layout; pip runs for real, offline (``PIP_NO_INDEX``,
with ``PIP_FIND_LINKS`` pointing at the fixture), so no test touches the network.

The bernoulli_glm test compares the task with numbers copied from sbibm 1.1.0's files (its
stimulus, and observation 1 with its spike train): the task is sbibm's even without the wheel.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import torch

from trainforge import cli, config
from trainforge.driver import launch, recipe_change
from trainforge.workloads.sbi import observations, sbibm_data, sources
from trainforge.workloads.sbi.config import EvaluationSection
from trainforge.workloads.sbi.observations import Observations
from trainforge.workloads.sbi.sbibm_data import SbibmDataError, open_data
from trainforge.workloads.sbi.tasks import get_task
from trainforge.workloads.sbi.tasks.bernoulli_glm import design_matrix, stimulus

DEBUG = Path(__file__).resolve().parents[2] / "recipes" / "sbi" / "two_moons_debug.yaml"
FILES = "sbibm/tasks/{task}/files"
X_OBS = {1: [0.5, -0.25], 2: [-0.125, 0.75]}
THETA = {1: [0.125, 0.25], 2: [-0.375, 0.5]}  # exact in float32
REFERENCE = {
    1: [[0.125, 0.25], [0.1875, 0.3125], [0.0625, 0.125]],
    2: [[-0.5, 0.5], [-0.25, 0.125], [-0.375, 0.625], [0.0, 0.25], [-0.125, 0.375], [0.5, 0.0]],
}


def _csv(prefix: str, rows: list[list[float]]) -> str:
    header = ",".join(f"{prefix}_{i + 1}" for i in range(len(rows[0])))
    return "\n".join([header, *(",".join(repr(v) for v in row) for row in rows)]) + "\n"


def _build_wheel(path: Path) -> Path:
    """sbibm's layout: two two_moons observations and bernoulli_glm's design matrix, plus the
    dist-info pip needs to accept the file as sbibm 1.1.0's wheel."""
    design = io.BytesIO()
    torch.save(design_matrix().float(), design)
    with zipfile.ZipFile(path, "w") as wheel:
        for k in (1, 2):
            folder = f"{FILES.format(task='two_moons')}/num_observation_{k}"
            wheel.writestr(f"{folder}/observation.csv", _csv("data", [X_OBS[k]]))
            wheel.writestr(f"{folder}/true_parameters.csv", _csv("parameter", [THETA[k]]))
            samples = _csv("parameter", REFERENCE[k]).encode()
            wheel.writestr(f"{folder}/reference_posterior_samples.csv.bz2", bz2.compress(samples))
        wheel.writestr(f"{FILES.format(task='bernoulli_glm')}/design_matrix.pt", design.getvalue())
        info = "sbibm-1.1.0.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: sbibm\nVersion: 1.1.0\n")
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    (tmp_path / "links").mkdir()
    return _build_wheel(tmp_path / "links" / sbibm_data.WHEEL)


@pytest.fixture
def unpacked(tmp_path: Path, wheel: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "unpacked")
    return tmp_path / "unpacked"


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache home, no copy named, and pip without an index: the network is never
    asked. Returns the cache folder."""
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(sbibm_data.PATH_ENV, raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    return tmp_path / "home" / "sbibm"


def _tensor(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_a_wheel_and_an_unpacked_copy_read_alike(wheel: Path, unpacked: Path) -> None:
    copies = [
        open_data(str(wheel), sha256=_sha256(wheel)),
        open_data(str(unpacked)),  # the folder holding sbibm/
        open_data(str(unpacked / "sbibm")),  # the package folder itself
    ]
    for data in copies:
        for k in (1, 2):
            assert torch.equal(data.observation("two_moons", k), _tensor(X_OBS[k]))
            assert torch.equal(data.true_parameters("two_moons", k), _tensor(THETA[k]))
            assert torch.equal(data.reference_samples("two_moons", k), _tensor(REFERENCE[k]))
        assert torch.equal(data.design_matrix(), design_matrix().float())
    assert copies[1].location == copies[2].location == (unpacked / "sbibm").resolve()


def test_a_wheel_must_be_the_pinned_one(
    wheel: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = f"its sha256 is {_sha256(wheel)}, expected {sbibm_data.WHEEL_SHA256}"
    with pytest.raises(
        SbibmDataError, match=f"workload.evaluation.sbibm_path: {wheel} .*{expected}"
    ):
        open_data(str(wheel))
    monkeypatch.setenv(sbibm_data.PATH_ENV, str(wheel))
    with pytest.raises(SbibmDataError, match=rf"\$TRAINFORGE_SBIBM: {wheel} .*{expected}"):
        open_data()


def test_missing_files_tasks_and_numbers_are_named(unpacked: Path, tmp_path: Path) -> None:
    data = open_data(str(unpacked))
    lacking = "tasks/slcp/files/num_observation_1/observation.csv"
    with pytest.raises(SbibmDataError, match=f"lacks sbibm's {lacking}"):
        data.observation("slcp", 1)
    with pytest.raises(SbibmDataError, match="sbibm has no stored data for task 'sir'"):
        data.observation("sir", 1)
    with pytest.raises(SbibmDataError, match=r"numbered 1\.\.10, got 11"):
        data.reference_samples("two_moons", 11)
    with pytest.raises(
        SbibmDataError, match=r"does not exist; set workload\.evaluation\.sbibm_path"
    ):
        open_data(str(tmp_path / "nowhere.whl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SbibmDataError, match="holds neither sbibm/tasks/ nor tasks/"):
        open_data(str(tmp_path / "empty"))


def test_the_wheel_is_fetched_with_pip_into_the_cache_once(
    wheel: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))  # pip's "index": the fixture
    path = sbibm_data.locate(sha256=_sha256(wheel))
    assert path == offline / sbibm_data.WHEEL
    assert path.read_bytes() == wheel.read_bytes()
    assert [p.name for p in offline.iterdir()] == [sbibm_data.WHEEL]  # no temporary left
    # from now on the cache answers: pip would find nothing
    monkeypatch.delenv("PIP_FIND_LINKS")
    wheel.unlink()
    assert sbibm_data.locate(sha256=_sha256(path)) == path
    assert torch.equal(
        open_data(sha256=_sha256(path)).observation("two_moons", 1), _tensor(X_OBS[1])
    )


def test_a_download_that_is_not_the_pinned_wheel_is_not_cached(
    wheel: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))
    with pytest.raises(
        SbibmDataError, match=r"the downloaded file .* is not sbibm 1\.1\.0's wheel"
    ):
        sbibm_data.locate()
    assert list(offline.iterdir()) == []


def test_offline_and_no_copy_is_one_clear_error(offline: Path) -> None:
    with pytest.raises(SbibmDataError) as info:
        sbibm_data.locate()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "sbibm's stored observations are not here and could not be downloaded (pip download "
        "sbibm==1.1.0: ERROR: No matching distribution found for sbibm==1.1.0); set "
        "workload.evaluation.sbibm_path (or $TRAINFORGE_SBIBM) to a copy of "
        "sbibm-1.1.0-py2.py3-none-any.whl"
    )
    assert message.endswith("or use workload.evaluation.observations_from=own (this project's "
                            "seeded observations)")  # fmt: skip
    assert list(offline.iterdir()) == []  # nothing half-written


def test_train_refuses_a_missing_copy_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def must_not_connect(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected to Ray despite a recipe error")

    monkeypatch.setattr(launch, "connect", must_not_connect)
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "sbibm.whl"
    overrides = ["workload.evaluation.observations_from=sbibm"]
    code = cli.main(["train", str(DEBUG), *overrides, f"workload.evaluation.sbibm_path={missing}"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"trainforge: error: workload.evaluation.sbibm_path: {missing} does not")
    assert not (tmp_path / "runs" / "two_moons_debug").exists()  # no run started


# -- which observations -------------------------------------------------------------------------


def test_observations_come_from_sbibm_or_from_our_own(unpacked: Path) -> None:
    task = get_task("two_moons")
    cfg = EvaluationSection(
        observations=[1, 2], observations_from="sbibm", sbibm_path=str(unpacked)
    )
    observed = Observations.of(task, cfg)
    assert observed.label == "sbibm 1.1.0"
    theta, x = observed.observation(2)
    assert torch.equal(theta, _tensor(THETA[2])) and torch.equal(x, _tensor(X_OBS[2]))
    stored = _tensor(REFERENCE[2])
    assert torch.equal(observed.reference(2, 10_000, seed=0), stored)  # all that is stored
    subset = observed.reference(2, 4, seed=3)  # a seeded random subset of the stored rows
    rows = [next(i for i, row in enumerate(stored) if torch.equal(row, s)) for s in subset]
    expected = torch.randperm(6, generator=torch.Generator().manual_seed(3))[:4].tolist()
    assert rows == expected
    record = observed.describe([2])
    assert record["observations_from"] == "sbibm" and record["sbibm_version"] == "1.1.0"
    assert record["observations"]["2"] == {"x": X_OBS[2], "theta_true": THETA[2]}

    own = Observations.of(task, EvaluationSection(observations_from="own"))
    assert own.label == "own" and own.describe([1])["observations_from"] == "own"
    for got, want in zip(own.observation(1), task.observation(1), strict=True):
        assert torch.equal(got, want)


def test_prepare_names_the_copy_and_only_when_sbibm_is_used(unpacked: Path, tmp_path: Path) -> None:
    def load(*overrides: str) -> object:
        return config.load(DEBUG, list(overrides)).workload

    sbibm = ["workload.evaluation.observations_from=sbibm"]
    named = load(*sbibm, f"workload.evaluation.sbibm_path={unpacked}")
    prepared = observations.prepare(named)
    assert prepared.evaluation.sbibm_path == str((unpacked / "sbibm").resolve())
    # bernoulli_glm's design matrix is compared with the copy's (the fixture holds ours)
    glm = load(*sbibm, f"workload.evaluation.sbibm_path={unpacked}", "workload.task=bernoulli_glm")
    assert observations.prepare(glm).evaluation.sbibm_path == prepared.evaluation.sbibm_path
    # nothing to read: own observations, none asked for, or a custom task
    for unused in (
        load(),  # the debug recipe: own
        load(*sbibm, "workload.evaluation.observations=[]"),
        load(*sbibm, "workload.task=custom", "workload.prior=a:b", "workload.simulator=a:c"),
    ):
        assert observations.prepare(unused) is unused
    missing = load(*sbibm, f"workload.evaluation.sbibm_path={tmp_path / 'gone'}")
    with pytest.raises(SbibmDataError, match=r"workload\.evaluation\.sbibm_path: .*gone does not"):
        observations.check(missing)


# -- bernoulli_glm is sbibm's --------------------------------------------------------------------

# sbibm 1.1.0, sbibm/tasks/bernoulli_glm/files: stimulus_I.pt[:6], and observation 1's
# observation.csv with its spike train (observation_raw.csv)
SBIBM_STIMULUS = [
    0.49671414494514465, -0.13826429843902588, 0.6476885676383972, 1.5230298042297363,
    -0.2341533750295639, -0.23413695394992828,
]  # fmt: skip
SBIBM_X1 = [56.0, 3.32306, 14.356438, 11.104893, -4.167525, -18.507809, -21.917496, -9.553517,
            -0.357257, -5.497825]  # fmt: skip
SBIBM_SPIKES1 = (
    "1101111111100000011111110001110111100000111100001110001111001100011111001110000000111000"
    "111110000111"
)


def test_bernoulli_glm_has_sbibms_stimulus_and_statistics() -> None:
    assert stimulus()[:6].tolist() == SBIBM_STIMULUS
    spikes = torch.tensor([float(c) for c in SBIBM_SPIKES1], dtype=torch.float64)
    x = spikes @ design_matrix()  # the task's x = Vᵀy
    assert torch.allclose(x, torch.tensor(SBIBM_X1, dtype=torch.float64), atol=1e-5, rtol=0)
    # simulations cached under the former (torch-drawn) stimulus are not reused
    glm = config.load(DEBUG, ["workload.task=bernoulli_glm"]).workload
    assert sources.resolve(glm).fingerprint == {"task": "bernoulli_glm", "revision": 2}
    assert sources.resolve(config.load(DEBUG).workload).fingerprint == {"task": "two_moons"}


def test_where_a_machine_keeps_sbibm_is_no_recipe_change() -> None:
    """A run resumed on a machine whose copy lies elsewhere goes on; other observations do not."""

    def resolved(*overrides: str) -> dict:
        return config.to_container(config.load(DEBUG, list(overrides)))

    here = resolved("workload.evaluation.sbibm_path=/home/a/.cache/trainforge/sbibm/x.whl")
    there = resolved("workload.evaluation.sbibm_path=/shared/sbibm-1.1.0-py2.py3-none-any.whl")
    assert recipe_change.changes(here, there) == {}
    other = resolved("workload.evaluation.observations_from=sbibm")
    assert recipe_change.changes(resolved(), other) == {
        "workload.evaluation.observations_from": ("own", "sbibm")
    }


def test_evaluation_scores_at_sbibms_observations_against_its_samples(
    unpacked: Path, tmp_path: Path
) -> None:
    """evaluate.run samples the posterior at sbibm's x and compares with sbibm's stored samples
    (an untrained estimator: what is checked is where the numbers come from)."""
    from trainforge.workloads.sbi import estimator as estimators
    from trainforge.workloads.sbi import evaluate
    from trainforge.workloads.sbi.c2st import c2st

    overrides = [
        "workload.evaluation.observations=[2]", "workload.evaluation.observations_from=sbibm",
        f"workload.evaluation.sbibm_path={unpacked}", "workload.evaluation.num_samples=40",
        "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false",
    ]  # fmt: skip
    cfg = config.load(DEBUG, overrides).workload
    source = sources.resolve(cfg)
    theta = torch.rand(200, 2, generator=torch.Generator().manual_seed(0)) * 2 - 1
    record = estimators.BuildRecord.from_config(cfg.estimator, 2, 2)
    estimator = estimators.build(record, theta, theta + 0.1).eval()
    metrics, files = evaluate.run(estimator, source, cfg.evaluation, seed=5, folder=tmp_path)

    assert files == [tmp_path / "observations.json"]
    written = json.loads(files[0].read_text())
    assert written["observations_from"] == "sbibm"
    assert written["observations"] == {"2": {"x": X_OBS[2], "theta_true": THETA[2]}}
    # the same draw at sbibm's x, scored against sbibm's 6 stored samples (as many of each: a
    # random 6 of the 40, seeded, since an ensemble's draws come member by member)
    posterior = evaluate.posterior_of(estimator, source)
    torch.manual_seed(5 + 2)
    samples = posterior.sample((40,), x=_tensor(X_OBS[2]), show_progress_bars=False)
    subset = torch.randperm(40, generator=torch.Generator().manual_seed(5))[:6]
    assert metrics["c2st/obs2"] == c2st(_tensor(REFERENCE[2]), samples[subset], seed=5)
    assert metrics["c2st/mean"] == metrics["c2st/obs2"]
