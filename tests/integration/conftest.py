"""What the integration tests that run `trainforge` commands in a user's home share."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.test_local_cluster import env_for, trainforge


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory):
    """One user's home; its lasting local cluster is stopped at the end whatever happened."""
    path = tmp_path_factory.mktemp("home")
    yield path
    subprocess.run([*trainforge(), "cluster", "stop"], env=env_for(path), timeout=60)
