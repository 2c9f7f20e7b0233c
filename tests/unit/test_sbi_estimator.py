"""SBI density estimators (``trainforge.workloads.sbi.estimator``): built by sbi's builders,
rebuilt from their record and weights, z-scored from the data given to the builder, and the
embedding nets with their input-shape checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi.config import EstimatorSection
from trainforge.workloads.sbi.estimator import EstimatorLoss as Loss


@pytest.mark.parametrize("model", ["maf", "nsf", "mdn", "zuko_maf"])
def test_an_estimator_is_rebuilt_from_its_record_and_weights(model: str) -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(model=model), 2, 2)
    built = estimators.build(record, theta * 3 + 1, x - 2)  # z-scoring from these numbers
    rebuilt = estimators.rebuild(record, built.state_dict())
    loss = Loss(built.eval())
    again = Loss(rebuilt.eval())
    torch.testing.assert_close(loss(theta[:50], x[:50]), again(theta[:50], x[:50]))
    assert loss(theta[:50], x[:50]).shape == (50,)


def test_z_scoring_comes_from_the_data_given_to_the_builder() -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    torch.manual_seed(0)
    a = estimators.build(record, theta, x)
    torch.manual_seed(0)
    b = estimators.build(record, theta * 10, x)
    assert not torch.allclose(Loss(a)(theta[:5], x[:5]), Loss(b)(theta[:5], x[:5]))


@pytest.mark.parametrize(
    ("embedding", "shape", "dim_x"),
    [("fully_connected", [], 6), ("cnn", [16, 16], 256), ("permutation_invariant", [5, 3], 15)],
)
def test_embedding_nets_build_and_train(embedding: str, shape: list[int], dim_x: int) -> None:
    cfg = EstimatorSection(embedding=embedding, embedding_input_shape=shape)  # type: ignore[arg-type]
    estimators.check(cfg)
    record = estimators.BuildRecord.from_config(cfg, 2, dim_x)
    theta, x = torch.randn(64, 2), torch.randn(64, dim_x)
    model = Loss(estimators.build(record, theta, x))
    loss = model(theta, x).mean()
    loss.backward()
    assert torch.isfinite(loss)
    rebuilt = estimators.rebuild(record, model.estimator.state_dict())
    torch.testing.assert_close(Loss(rebuilt.eval())(theta, x), model.eval()(theta, x))


def test_embedding_shape_must_match_x() -> None:
    cfg = EstimatorSection(embedding="cnn", embedding_input_shape=[8, 8])
    with pytest.raises(RecipeError, match="holds 64 values, but x has 10"):
        estimators.embedding_net(estimators.BuildRecord.from_config(cfg, 2, 10))
    with pytest.raises(RecipeError, match="embedding_input_shape: CNN output size is zero"):
        estimators.embedding_net(estimators.BuildRecord.from_config(cfg, 2, 64))


WHAT_A_FIRST_STEP_IMPORTS = """
import importlib, json, sys
import torch
from trainforge.workloads import spec_for
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi.config import EstimatorSection
for module in spec_for("sbi").worker_imports:  # as a cold command's own worker does at start
    importlib.import_module(module)
before = set(sys.modules)
theta, x = torch.randn(200, 2), torch.randn(200, 2)
for model in ("maf", "nsf", "mdn", "zuko_maf", "zuko_nsf"):
    record = estimators.BuildRecord.from_config(EstimatorSection(model=model), 2, 2)
    loss = estimators.EstimatorLoss(estimators.build(record, theta, x))(theta[:64], x[:64]).mean()
    loss.backward()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_worker_that_imported_the_specs_modules_imports_nothing_heavy_at_its_first_step() -> None:
    """``WorkloadSpec.worker_imports`` (a cold command's own workers import it while the command
    makes the data) covers what building each estimator and its first step import: sbi's
    package (scipy, sklearn, matplotlib through sbi.utils) and sympy (``torch.broadcast_shapes``
    imports it at its first call)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WHAT_A_FIRST_STEP_IMPORTS], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    new = json.loads(done.stdout.strip().splitlines()[-1])
    heavy = ("sbi", "scipy", "sklearn", "matplotlib", "sympy", "tensorboard", "pandas")
    assert [m for m in new if m.split(".")[0] in heavy] == []


def test_an_nsf_posterior_samples_without_torchs_deprecation_warning() -> None:
    """nflows' LU transform (in sbi's NSF) calls the deprecated torch.triangular_solve when it
    samples; torch's warning would reach the run's console. A fresh process each way, as a
    worker is: the warning is there without the estimators' module, and not with it."""
    sample = "from nflows.transforms.lu import LULinear; LULinear(3).inverse(torch.randn(4, 3))"

    def stderr(imports: str) -> str:
        code = f"import torch{imports}; {sample}"
        env = {**os.environ, "PYTHONWARNINGS": ""}  # Python's default filters, as a worker's
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, check=True, timeout=120)  # fmt: skip
        return done.stderr

    assert "triangular_solve is deprecated" in stderr("")  # what the filter is for
    assert "triangular_solve" not in stderr(", trainforge.workloads.sbi.estimator")


USERS_NETS = """
import torch
from torch import nn


class Features(nn.Module):
    def __init__(self, dim_x, width=4):
        super().__init__()
        self.width = width
        self.layer = nn.Linear(dim_x, width)

    def forward(self, x):
        return torch.tanh(self.layer(x))


def flat():
    return nn.Linear(3, 4)


def one_dimensional():
    return nn.Flatten(0)


def not_a_net():
    return 4


def small_nsf(theta, x, embedding_net, hidden=8):
    from sbi.neural_nets.net_builders import build_nsf

    return build_nsf(theta, x, hidden_features=hidden, num_transforms=2,
                     embedding_net=embedding_net)


def no_embedding(theta, x):
    from sbi.neural_nets.net_builders import build_maf

    return build_maf(theta, x, num_transforms=1)


def four(theta, x):
    return 4


def a_linear(theta, x):
    return nn.Linear(2, 2)


class ScalarLoss(nn.Linear):
    def loss(self, theta, condition):
        return (self(condition) - theta).pow(2).mean()

    def log_prob(self, theta, condition):
        return -self.loss(theta, condition)

    def sample(self, shape, condition):
        return self(condition)


def scalar_loss(theta, x):
    return ScalarLoss(x.shape[1], theta.shape[1])


def refuses(theta, x):
    raise ValueError("theta has too few rows\\nmore")
"""


@pytest.fixture
def users_nets(importable_module: Callable[[str, str], str]) -> str:
    return importable_module("user_nets", USERS_NETS)


def test_a_users_embedding_net_is_built_with_its_arguments_and_rebuilt(users_nets: str) -> None:
    section = EstimatorSection(embedding=f"{users_nets}:Features", embedding_kwargs={"width": 5})
    record = estimators.BuildRecord.from_config(section, 2, 2)
    estimators.probe_embedding(record)
    theta, x = _data()
    built = estimators.build(record, theta, x)
    [net] = [m for m in built.embedding_net.modules() if type(m).__name__ == "Features"]
    assert net.width == 5  # after sbi's z-scoring of x, inside the estimator
    again = estimators.rebuild(estimators.BuildRecord(**record.to_dict()), built.state_dict())
    torch.testing.assert_close(Loss(built.eval())(theta[:8], x[:8]),
                               Loss(again.eval())(theta[:8], x[:8]))  # fmt: skip


@pytest.mark.parametrize(
    ("net", "kwargs", "message"),
    [
        ("flat", {}, ":flat on x of shape (2, 2) raised RuntimeError: "),
        (
            "one_dimensional",
            {},
            ":one_dimensional returned (4,) for x of shape (2, 2): expected (2, features)",
        ),
        ("Features", {"depth": 2}, ":Features(depth=2, dim_x=2) raised TypeError: "),
        ("not_a_net", {}, ":not_a_net returned int, not an nn.Module"),
        ("Missing", {}, "has no 'Missing'"),
    ],
)
def test_a_broken_users_embedding_net_is_one_line_naming_it(
    users_nets: str, net: str, kwargs: dict[str, object], message: str
) -> None:
    section = EstimatorSection(embedding=f"{users_nets}:{net}", embedding_kwargs=kwargs)
    with pytest.raises(estimators.EmbeddingError, match=re.escape(message)) as caught:
        estimators.probe_embedding(estimators.BuildRecord.from_config(section, 2, 2))
    assert str(caught.value).startswith("workload.estimator.embedding: ")


def test_embedding_kwargs_are_only_for_a_users_net() -> None:
    with pytest.raises(RecipeError, match=r"embedding_kwargs: arguments for your own embedding"):
        EstimatorSection(embedding="fully_connected", embedding_kwargs={"width": 3})
    with pytest.raises(RecipeError, match=r"or your own net by import path"):
        EstimatorSection(embedding="fully-connected")


def test_a_users_builder_makes_the_estimator_with_the_recipes_embedding_and_is_rebuilt(
    users_nets: str,
) -> None:
    section = EstimatorSection(model=f"{users_nets}:small_nsf", model_kwargs={"hidden": 6},
                               embedding=f"{users_nets}:Features")  # fmt: skip
    record = estimators.BuildRecord.from_config(section, 2, 2)
    estimators.probe_estimator(record)
    theta, x = _data()
    built = estimators.build(record, theta, x)
    assert type(built).__name__ == "NFlowsFlow"
    assert any(type(m).__name__ == "Features" for m in built.modules())  # the recipe's net
    assert {p.shape for p in built.parameters()} >= {torch.Size([6, 6])}  # hidden=6
    again = estimators.rebuild(estimators.BuildRecord(**record.to_dict()), built.state_dict())
    torch.testing.assert_close(Loss(built.eval())(theta[:8], x[:8]),
                               Loss(again.eval())(theta[:8], x[:8]))  # fmt: skip


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("no_embedding", {"embedding": "fully_connected"}, ":no_embedding takes no "
         "embedding_net, and workload.estimator.embedding is fully_connected"),
        ("a_linear", {}, ":a_linear returned Linear (no loss, log_prob, sample): expected a "
         "density estimator"),
        ("four", {}, ":four returned int: expected a density estimator"),
        ("refuses", {}, ":refuses(θ, x) raised ValueError: theta has too few rows"),
        ("small_nsf", {"model_kwargs": {"width": 2}}, ":small_nsf(θ, x, width=2) raised "
         "TypeError: "),
        ("scalar_loss", {}, ":scalar_loss's loss(θ, condition=x) returned () for two rows: "
         "expected (2,), one loss per row"),
    ],
)  # fmt: skip
def test_a_broken_users_builder_is_one_line_naming_it(
    users_nets: str, model: str, options: dict[str, object], message: str
) -> None:
    section = EstimatorSection(model=f"{users_nets}:{model}", **options)  # type: ignore[arg-type]
    with pytest.raises(estimators.BuilderError) as caught:
        estimators.probe_estimator(estimators.BuildRecord.from_config(section, 2, 2))
    said = str(caught.value)
    assert said.startswith("workload.estimator.model: ") and message in said, said
    assert "\n" not in said


def test_sbis_builder_takes_the_arguments_it_names_and_refuses_others() -> None:
    section = EstimatorSection(model="nsf", model_kwargs={"num_blocks": 1, "tail_bound": 4.0})
    record = estimators.BuildRecord.from_config(section, 2, 2)
    estimators.probe_estimator(record)
    theta, x = _data()
    blocks = [m for m in estimators.build(record, theta, x).modules()
              if type(m).__name__ == "ResidualBlock"]  # fmt: skip
    assert blocks  # nflows' residual blocks: one per transform with num_blocks=1
    for kwargs, message in [
        ({"num_block": 1}, "model_kwargs.num_block: sbi's nsf builder takes no 'num_block'; "
         "it takes tail_bound, hidden_layers_spline_context, num_blocks"),
        ({"hidden_features": 8}, "model_kwargs.hidden_features: set by the recipe's own "
         "workload.estimator keys"),
    ]:  # fmt: skip
        section = EstimatorSection(model="nsf", model_kwargs=kwargs)
        with pytest.raises(estimators.BuilderError, match=re.escape(message)):
            estimators.probe_estimator(estimators.BuildRecord.from_config(section, 2, 2))
    zuko = EstimatorSection(model="zuko_nsf", model_kwargs={"fooo": 1})
    with pytest.raises(estimators.BuilderError, match=r"sbi's zuko_nsf builder given "):
        estimators.probe_estimator(estimators.BuildRecord.from_config(zuko, 2, 2))


def test_an_unknown_estimator_name_offers_a_builder_by_import_path() -> None:
    with pytest.raises(RecipeError, match=r"or your own builder by import path"):
        EstimatorSection(model="nsff")
