"""Command line: argument parsing only; each subcommand hands off to its module."""

from __future__ import annotations

import argparse
import sys

from runtime import __version__
from runtime.errors import RecipeError


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="trainforge", description="Distributed training from YAML recipes (Ray Train + DDP)."
    )
    root.add_argument("--version", action="version", version=f"trainforge {__version__}")
    commands = root.add_subparsers(dest="command", required=True)
    for name, text in (
        ("train", "train a recipe on a local Ray instance or the cluster in RAY_ADDRESS"),
        ("validate", "check a recipe and print it fully resolved"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("recipe", help="path to a recipe YAML file")
        command.add_argument(
            "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.lr=0.01"
        )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from runtime import config

        cfg = config.load(args.recipe, args.overrides)
        if args.command == "validate":
            print(config.to_yaml(cfg), end="")
            print(f"# global batch: {config.global_batch(cfg)}", file=sys.stderr)
            _warn_missing_data(cfg)
            return 0
        from runtime import launch

        return launch.train(cfg).exit_code
    except RecipeError as exc:
        print(f"trainforge: error: {exc}", file=sys.stderr)
        return 2


def _warn_missing_data(cfg: object) -> None:
    from runtime.workloads import check_workload_data

    try:
        check_workload_data(cfg.workload)  # type: ignore[attr-defined]
    except RecipeError as exc:
        print(f"# note: `train` would refuse on this machine: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
