"""Neural ratio estimation (``workload.method: nre``, sbi's NRE_B; ``nre_c``, sbi's NRE_C):
the estimator is sbi's classifier (resnet unless the recipe names linear or mlp), its per-row
loss is sbi's contrastive loss — the same number as sbi's own NRE (and NRE_C) trainer on the
same batch and the same random atoms — it learns, the export loads as sbi's MCMCPosterior
over the ratio-based potential, and a flow's name is refused for it in one line before
anything starts."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import DEBUG, _data, assert_refused_before_launch
from trainforge import config
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
from trainforge.workloads.sbi.methods import nre
from trainforge.workloads.sbi.tasks import get_task

NRE_DEBUG = DEBUG.with_name("two_moons_nre_debug.yaml")


def _record(model: str | None = None, **kwargs: object) -> estimators.BuildRecord:
    section = EstimatorSection(model=model, hidden_features=16, model_kwargs=dict(kwargs))
    return estimators.BuildRecord.from_config(section, 2, 2, method="nre")


def _loss(estimator: torch.nn.Module, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return estimators.EstimatorLoss(estimator, "nre")(theta, x)


def test_nre_trains_sbis_resnet_classifier_with_one_loss_per_row() -> None:
    from sbi.neural_nets.ratio_estimators import RatioEstimator

    theta, x = _data()
    record = _record()
    assert (record.model, record.method) == ("resnet", "nre")  # the method's default
    built = estimators.build(record, theta, x)
    assert isinstance(built.ratio, RatioEstimator) and built.num_atoms == nre.NUM_ATOMS
    torch.testing.assert_close(built(theta[:7], x[:7]), built.ratio(theta[:7], x[:7]))
    loss = _loss(built, theta[:64], x[:64])
    assert loss.shape == (64,) and bool(loss.ge(0).all())
    assert abs(loss.mean().item() - math.log(nre.NUM_ATOMS)) < 0.3  # untrained: chance
    loss.mean().backward()
    assert all(p.grad is not None for p in built.parameters() if p.requires_grad)
    linear = estimators.build(_record("linear", num_atoms=4), theta, x)
    assert linear.num_atoms == 4 and type(linear.ratio) is RatioEstimator


@pytest.mark.parametrize(("batch", "atoms"), [(200, 10), (50, 3)])
def test_the_contrastive_loss_is_sbis_nre_b_loss_on_the_same_atoms(
    batch: int, atoms: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sbi.inference import NRE

    monkeypatch.chdir(tmp_path)  # sbi's trainer makes a TensorBoard folder where it runs
    theta, x = _data()
    built = estimators.build(_record(num_atoms=atoms), theta, x)
    trainer = NRE(prior=get_task("two_moons").prior_distribution(), show_progress_bars=False)
    trainer._neural_net = built.ratio  # sbi's trainer around the very same classifier
    torch.manual_seed(7)
    ours = _loss(built, theta[:batch], x[:batch]).mean()
    torch.manual_seed(7)
    theirs = trainer._loss(theta[:batch], x[:batch], num_atoms=atoms)
    torch.testing.assert_close(ours, theirs)
    assert abs(ours.item() - math.log(atoms)) < 0.5  # and not merely both chance
    # the atoms themselves: sbi's torch.multinomial over the batch less the row itself
    probs = torch.ones(batch, batch) * (1 - torch.eye(batch)) / (batch - 1)
    torch.manual_seed(3)
    expected = torch.multinomial(probs, num_samples=atoms - 1, replacement=False)
    torch.manual_seed(3)
    drawn = nre.contrastive_atoms(batch, atoms)
    assert torch.equal(drawn, expected)
    assert not bool((drawn == torch.arange(batch)[:, None]).any())


@pytest.mark.parametrize(("classes", "gamma"), [(5, 1.0), (3, 0.25)])
def test_nre_c_is_sbis_nre_c_loss_on_the_same_atoms(
    classes: int, gamma: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sbi.inference import NRE_C

    monkeypatch.chdir(tmp_path)
    theta, x = _data()
    section = EstimatorSection(hidden_features=16,
                               model_kwargs={"num_classes": classes, "gamma": gamma})  # fmt: skip
    record = estimators.BuildRecord.from_config(section, 2, 2, method="nre_c")
    estimators.probe_estimator(record)  # nre_c's own model_kwargs are taken
    built = estimators.build(record, theta, x)
    trainer = NRE_C(prior=get_task("two_moons").prior_distribution(), show_progress_bars=False)
    trainer._neural_net = built.ratio
    torch.manual_seed(11)
    ours = estimators.EstimatorLoss(built, "nre_c")(theta[:200], x[:200])
    torch.manual_seed(11)
    theirs = trainer._loss(theta[:200], x[:200], num_atoms=classes + 1, gamma=gamma)
    assert ours.shape == (200,)
    torch.testing.assert_close(ours.mean(), theirs)


def test_validation_atoms_are_fixed_and_leave_the_training_stream_alone() -> None:
    theta, x = _data()
    built = estimators.build(_record(), theta, x)
    with torch.no_grad():
        training = [_loss(built, theta[:300], x[:300]) for _ in range(2)]
        assert not torch.equal(*training)  # fresh atoms each step
        built.eval()
        state = torch.get_rng_state()
        validation = [_loss(built, theta[:300], x[:300]) for _ in range(2)]
        assert torch.equal(*validation) and torch.equal(torch.get_rng_state(), state)


def test_a_batch_above_atom_rows_forms_its_atoms_block_by_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    theta, x = _data()
    built = estimators.build(_record(), theta, x).eval()
    with torch.no_grad():
        blocks = [_loss(built, theta[:100], x[:100])]
        monkeypatch.setattr(nre, "ATOM_ROWS", 100)
        whole = _loss(built, theta[:300], x[:300])
    # the first block draws what a batch of its 100 rows alone would: its atoms are its own
    torch.testing.assert_close(whole[:100], blocks[0])
    assert whole.shape == (300,) and bool(torch.isfinite(whole).all())


def test_a_few_hundred_steps_lower_the_nre_loss() -> None:
    theta, x = _data()
    torch.manual_seed(0)
    model = estimators.EstimatorLoss(estimators.build(_record(), theta, x), "nre")
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.eval()
    with torch.no_grad():
        before = model(theta[1800:], x[1800:]).mean().item()
    model.train()
    for step in range(300):
        rows = torch.randint(0, 1800, (128,), generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        model(theta[rows], x[rows]).mean().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        after = model(theta[1800:], x[1800:]).mean().item()
    assert after < before - 1.0, (before, after)  # from chance, log 10 = 2.30


def test_the_nre_export_loads_as_an_mcmc_posterior_over_the_ratio(tmp_path: Path) -> None:
    from sbi.inference import MCMCPosterior

    theta, x = _data()
    record = _record(num_atoms=5)
    estimator = estimators.build(record, theta, x).eval()
    cfg = SBIWorkloadConfig(method="nre")
    cfg.posterior.num_chains, cfg.posterior.warmup_steps = 4, 10
    path = tmp_path / "posterior.pt"
    export.save_posterior(path, estimator, record, {"task": "two_moons"}, export.sampling_of(cfg))
    bundle = torch.load(path, weights_only=True)
    assert (bundle["build"]["method"], bundle["build"]["model"]) == ("nre", "resnet")
    posterior = export.load_posterior(path)
    assert isinstance(posterior, MCMCPosterior)
    assert (posterior.num_chains, posterior.warmup_steps) == (4, 10)
    x_obs = x[0]
    torch.manual_seed(0)
    samples = posterior.sample((40,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (40, 2) and bool(samples.abs().le(1).all())  # the prior's box
    prior = get_task("two_moons").prior_distribution()
    with torch.no_grad():
        ratio = estimator(samples, x_obs.expand(len(samples), -1))
    torch.testing.assert_close(posterior.potential(samples, x=x_obs),
                               ratio + prior.log_prob(samples), rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["workload.estimator.model=maf"], "workload.estimator.model: maf is a density "
         "estimator (a flow), and method nre learns the likelihood-to-evidence ratio"),
        (["workload.method=npe", "workload.estimator.model=resnet"],
         "workload.estimator.model: resnet is the estimator of nre and nre_c, and method npe "
         "learns"),
        (["workload.estimator.model=resnt"],
         "workload.estimator.model: 'resnt' is not a known estimator (did you mean 'resnet'?)"),
    ],
)  # fmt: skip
def test_a_model_of_another_kind_is_one_line_and_exit_2_before_launch(
    overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    assert_refused_before_launch(NRE_DEBUG, overrides, message, monkeypatch, capsys)


def test_nre_model_kwargs_are_num_atoms_and_sbis_classifier_arguments() -> None:
    estimators.probe_estimator(_record(num_atoms=5, num_blocks=3))
    misspelt = re.escape("model_kwargs.num_atom: sbi's resnet builder takes no 'num_atom'")
    with pytest.raises(estimators.BuilderError, match=misspelt):
        estimators.probe_estimator(_record(num_atom=5))
    cfg = config.load(NRE_DEBUG, []).workload
    assert (cfg.method, cfg.estimator.model, cfg.estimator.model_kwargs) == (
        "nre", "resnet", {"num_atoms": 10})  # fmt: skip
