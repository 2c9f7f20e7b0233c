"""trainforge's folder on this machine for what outlives a command: ``$TRAINFORGE_HOME``, default
``~/.cache/trainforge`` (each user's own). The lasting local cluster, the sbibm wheel and the
empty MLflow store each keep a subfolder of it."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "TRAINFORGE_HOME"


def folder() -> Path:
    home = os.environ.get(HOME_ENV)
    return Path(home) if home else Path.home() / ".cache" / "trainforge"
