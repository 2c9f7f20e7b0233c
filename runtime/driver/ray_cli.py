"""Ray's command line for the lasting local cluster's `ray start`, without the imports of the
commands it does not use.

Ray's CLI module imports, before it parses anything, the command groups of Ray Serve, the State
API and Ray Jobs: Serve alone brings FastAPI and pandas. That is 1.7-2.4 s of a cold command's
`ray start` on this project's 2-core machine, every time the lasting cluster starts. Ray imports
each of these groups inside ``try``/``except`` and goes on without a group whose import fails;
marking their modules absent (``None`` in ``sys.modules``) makes each import fail at once. Only
the CLI's groups are skipped: Serve, the State API and Jobs themselves still import wherever
something uses them.

    python -m trainforge.driver.ray_cli start --head --block ...
"""

from __future__ import annotations

import sys

UNUSED_COMMAND_GROUPS = (
    "ray.serve.scripts",  # `ray serve …`
    "ray.util.state.state_cli",  # `ray list|get|summary|logs …`
    "ray.dashboard.modules.job.cli",  # `ray job …`
)


def skip_unused_command_groups() -> None:
    for name in UNUSED_COMMAND_GROUPS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # import fails at once


def main() -> None:
    skip_unused_command_groups()
    from ray.scripts.scripts import main as ray_main

    sys.argv[0] = "ray"
    ray_main()


if __name__ == "__main__":
    main()
