"""A worker plugin for diagnosis (``TRAINFORGE_WORKER_PLUGINS=bench.env_probe``): each worker
writes its environment, its CUDA JIT cache's settings and whether the cache folder is there to
``/tmp/env-probe-<pid>.json``, so that two worker paths' processes can be compared."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def install(trainer: Any, checkpointer: Any) -> None:
    cache = os.environ.get("CUDA_CACHE_PATH") or str(Path.home() / ".nv" / "ComputeCache")
    Path(f"/tmp/env-probe-{os.getpid()}.json").write_text(json.dumps({
        "env": dict(sorted(os.environ.items())), "home": str(Path.home()), "cache": cache,
        "cache_exists": Path(cache).is_dir(), "uid": os.getuid(),
    }, indent=1))  # fmt: skip
