"""The driver's cluster helpers (``trainforge.driver.cluster``): the storage root a run
writes under."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainforge import config
from trainforge.driver import cluster

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def test_storage_root_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = config.load(DIGITS, ["run.storage_path=./runs"]).run
    assert cluster.storage_root(run) == str((tmp_path / "runs").resolve())
    run = config.load(DIGITS, ["run.storage_path=s3://bucket/runs"]).run
    assert cluster.storage_root(run) == "s3://bucket/runs"


JOIN_AND_CALL = """
import sys
{before}
import ray
from trainforge import ray_compat

ray_compat.skip_unused_serializer_addons()
ray.init(address=sys.argv[1], logging_level="WARNING", log_to_driver=False)

@ray.remote(num_cpus=0)
def echo(value):
    return value

assert ray.get(echo.remote({{"lr": 0.1}})) == {{"lr": 0.1}}
registered = [cls.__module__ for cls in ray.cloudpickle.CloudPickler.dispatch]
print("imported", *sorted(m for m in ray_compat.ADDON_MODULES if m in sys.modules))
print("registered", *sorted({{m.split(".")[0] for m in registered if m.startswith("pyarrow")}}))
"""


@pytest.mark.ray
@pytest.mark.parametrize("before", ["", "import pyarrow"])
def test_a_driver_builds_rays_serializer_addons_only_for_packages_it_imported(
    ray_cluster: Any, before: str
) -> None:
    """A driver's first Ray call no longer imports pydantic, starlette and pyarrow to register
    serializers for their types; a driver that imported pyarrow still gets Ray's serializers."""
    address = ray_cluster.get_runtime_context().gcs_address
    script = JOIN_AND_CALL.format(before=before)
    out = subprocess.run([sys.executable, "-c", script, address], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) if " " in line else (line, "")
                 for line in out.stdout.splitlines())  # fmt: skip
    if before:
        assert "pyarrow" in lines["imported"] and lines["registered"] == "pyarrow"
    else:
        assert lines["imported"] == "" and lines["registered"] == ""
