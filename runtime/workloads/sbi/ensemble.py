"""Posterior ensembles: posteriors trained apart (other seeds, other GPUs, other machines) on
one task, written as one file that loads as sbi's ``EnsemblePosterior``, the equal-weight
mixture of its members.

Why: runs of one recipe that differ only in their seed end at different validation losses,
and their posteriors err in different places. On slcp at 10^6 simulations, mixtures of four
such runs scored 0.541 and 0.558 (C2ST, sbibm's observations 1-10) against 0.570-0.610 for
their members. On a machine with several GPUs
the members train at once, one per GPU, in the wall time of one run:

    trainforge ensemble --out slcp_ensemble.pt runs/slcp_s0 runs/slcp_s1 runs/slcp_s2 runs/slcp_s3

A member is a run's folder (its ``posterior.pt``) or a posterior file; a member that is itself
an ensemble gives its members, each one member of the new one. The file holds the members'
own bundles (build record, weights, how to get the prior): plain data, so it loads with
``torch.load(weights_only=True)`` like a single posterior does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainforge.atomic import replacing
from trainforge.errors import RecipeError

FORMAT = "trainforge-npe-ensemble/1"
MEMBER_FORMAT = "trainforge-npe/1"  # export.FORMAT (export imports this module, not the reverse)
POSTERIOR_FILE = "posterior.pt"  # what an SBI run writes into its folder


class EnsembleError(RecipeError):
    """A member is missing, is not a posterior, or does not fit the others (exit status 2)."""


def member_file(given: Path) -> Path:
    """A run's folder → its posterior file; a file → itself."""
    if given.is_dir():
        path = given / POSTERIOR_FILE
        if not path.is_file():
            raise EnsembleError(
                f"{given} has no {POSTERIOR_FILE}: not an SBI run's folder, or its run has not "
                "finished"
            )
        return path
    if not given.is_file():
        raise EnsembleError(f"{given} does not exist")
    return given


def read_bundles(path: Path) -> list[dict[str, Any]]:
    """The single-posterior bundles in ``path``: one for a posterior, each member's for an
    ensemble."""
    try:
        bundle = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, another pickle, not a torch file at all
        raise EnsembleError(f"{path} is not a trainforge posterior file: {exc}") from None
    kind = bundle.get("format") if isinstance(bundle, dict) else None
    if kind == MEMBER_FORMAT:
        return [bundle]
    if kind == FORMAT:
        return list(bundle["members"])
    raise EnsembleError(f"{path} is not a trainforge posterior file ({MEMBER_FORMAT} or {FORMAT})")


def combine(members: Sequence[Path], out: Path) -> dict[str, Any]:
    """Write the ensemble of ``members`` to ``out`` (atomically: a reader never sees half a
    file) and return what it holds: ``members`` (how many), ``prior`` and ``models``."""
    files = [member_file(Path(m)) for m in members]
    twice = [str(f) for f, n in Counter(f.resolve() for f in files).items() if n > 1]
    if twice:
        raise EnsembleError(f"listed more than once: {', '.join(twice)} (it would weigh double)")
    if out.resolve() in {f.resolve() for f in files}:
        raise EnsembleError(f"--out {out} is one of the members; write the ensemble elsewhere")
    bundles = [(f, b) for f in files for b in read_bundles(f)]
    if len(bundles) < 2:
        raise EnsembleError(f"an ensemble needs at least 2 posteriors; {len(bundles)} given")
    first_file, first = bundles[0]
    for file, bundle in bundles[1:]:
        if bundle["prior"] != first["prior"]:
            raise EnsembleError(
                f"{file}'s prior {_prior_name(bundle)} is not {first_file}'s "
                f"{_prior_name(first)}: members must be posteriors of one task"
            )
        for dim in ("dim_theta", "dim_x"):
            if bundle["build"][dim] != first["build"][dim]:
                raise EnsembleError(
                    f"{file} has {dim} {bundle['build'][dim]}, {first_file} "
                    f"{first['build'][dim]}: members must be posteriors of one task"
                )
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as temporary:
        torch.save({"format": FORMAT, "members": [b for _, b in bundles]}, temporary)
    models = Counter(b["build"]["model"] for _, b in bundles)
    return {"members": len(bundles), "prior": _prior_name(first), "models": dict(models)}


def _prior_name(bundle: dict[str, Any]) -> str:
    prior = bundle["prior"]
    return prior["task"] if "task" in prior else prior["import"]


def ensemble_posterior(bundle: dict[str, Any], member: Any) -> Any:
    """sbi's ``EnsemblePosterior`` (equal weights, CPU) of an ensemble file's bundle;
    ``member(bundle)`` makes one member's sbi posterior."""
    from sbi.inference import EnsemblePosterior

    return EnsemblePosterior([member(b) for b in bundle["members"]], device="cpu")
