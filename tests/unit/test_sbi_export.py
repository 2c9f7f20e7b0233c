"""The posterior export (``trainforge.workloads.sbi.export``): written atomically, loaded back
as sbi's DirectPosterior with the same log-probabilities, other files refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export
from trainforge.workloads.sbi.config import EstimatorSection


def test_export_loads_as_an_sbi_direct_posterior(tmp_path: Path) -> None:
    from sbi.inference import DirectPosterior

    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    estimator = estimators.build(record, theta, x).eval()
    path = tmp_path / "posterior.pt"
    export.save_posterior(path, estimator, record, {"task": "two_moons"})
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left over
    posterior = export.load_posterior(path)
    assert isinstance(posterior, DirectPosterior)
    x_obs = x[0]
    samples = posterior.sample((200,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (200, 2)
    assert bool(((samples >= -1) & (samples <= 1)).all())  # inside the prior box (rejection)
    ours = estimator.log_prob(samples.unsqueeze(1), condition=x_obs.unsqueeze(0)).squeeze(1)
    theirs = posterior.log_prob(samples, x=x_obs, norm_posterior=False)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a trainforge posterior file"):
        export.load_posterior(tmp_path / "other.pt")
