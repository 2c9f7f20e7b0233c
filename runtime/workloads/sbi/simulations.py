"""A simulation cache entry as its readers see it: the chunk files (θ, x and what was invalid in
each), the manifest written last (its presence means the entry is whole: the spec its key hashes,
the counts of invalid simulations, where the work ran), and the simulations loaded back. The
stage that makes an entry is ``simulate.py``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainforge.atomic import replacing
from trainforge.errors import RecipeError

if TYPE_CHECKING:  # torch only where simulations are read or written
    import torch

MANIFEST = "manifest.json"


def chunk_file(folder: Path, index: int) -> Path:
    return folder / f"chunk-{index:06d}.pt"


def save_chunk(result: dict[str, Any], path: Path) -> None:
    """One chunk's file, whole or not at all (written to a temporary name, then renamed)."""
    import torch

    chunk = {k: result[k] for k in ("theta", "x", "invalid", "failed", "first_failure")}
    chunk["worker"] = result.get("worker", "")
    with replacing(path) as temporary:
        torch.save(chunk, temporary)


def read_chunk(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's (θ, x)."""
    chunk = _load(path)
    return chunk["theta"], chunk["x"]


def _load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def chunk_facts(chunk: dict[str, Any]) -> dict[str, Any]:
    """What the manifest needs of a chunk, without its tensors."""
    return {
        "rows": len(chunk["x"]),
        "dim_theta": int(chunk["theta"].shape[1]),
        "dim_x": int(chunk["x"].shape[1]),
        "invalid": int(chunk["invalid"]),
        "failed": int(chunk.get("failed", 0)),
        "first_failure": str(chunk.get("first_failure", "")),
        "worker": str(chunk.get("worker", "")),
    }


def summarize(
    spec: dict[str, Any], key: str, chunk_paths: list[Path],
    known: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The manifest: the spec, the counts of invalid and raised simulations (the first error),
    and per node the processes that simulated and how many simulations each node did.
    ``known``: the facts of the chunks just simulated (by index); the others (written by an
    earlier, interrupted stage) are read back."""
    known = known or {}
    chunks = [known.get(i) or chunk_facts(_load(path)) for i, path in enumerate(chunk_paths)]
    failures = [c["first_failure"] for c in chunks if c["failed"]]
    ran_on: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        node, _, pid = chunk["worker"].rpartition(":")
        if pid:
            entry = ran_on.setdefault(node, {"processes": set(), "simulations": 0})
            entry["processes"].add(pid)
            entry["simulations"] += chunk["rows"]
    return {
        **spec,
        "key": key,
        "chunks": len(chunks),
        "invalid": sum(c["invalid"] for c in chunks),
        "failed": sum(c["failed"] for c in chunks),
        "first_failure": failures[0] if failures else "",
        "ran_on": {
            node: {"processes": len(e["processes"]), "simulations": e["simulations"]}
            for node, e in sorted(ran_on.items())
        },
        "dim_theta": chunks[0]["dim_theta"],
        "dim_x": chunks[0]["dim_x"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def invalid_summary(manifest: dict[str, Any]) -> str:
    """``37 of 5,000 are invalid: 25 raised in the simulator (first: …), 12 have NaN/inf in x``"""
    invalid, failed = manifest["invalid"], manifest.get("failed", 0)
    parts = []
    if failed:
        parts.append(f"{failed:,} raised in the simulator (first: {manifest['first_failure']})")
    if invalid - failed:
        parts.append(f"{invalid - failed:,} have NaN/inf in x")
    return f"{invalid:,} of {manifest['num_simulations']:,} are invalid: " + ", ".join(parts)


def check_invalid(folder: Path, drop_invalid: bool) -> None:
    """Refuse invalid simulations (NaN/inf in x, or the simulator raised) before training
    unless the recipe drops them; refuse always when none is valid."""
    manifest = read_manifest(folder)
    invalid, total = manifest["invalid"], manifest["num_simulations"]
    failed = manifest.get("failed", 0)
    raised = f" ({failed:,} raised: {manifest['first_failure']})" if failed else ""
    if invalid == total:
        raise RecipeError(
            f"workload.simulator: all {total:,} simulations have NaN or inf in x{raised}"
        )
    if invalid and not drop_invalid:
        raise RecipeError(
            f"workload.simulator: {invalid:,} of {total:,} simulations have NaN or inf in x"
            f"{raised}; set workload.simulation.drop_invalid=true to drop them"
        )


def load(folder: Path, drop_invalid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """All simulations of a finished cache entry, in chunk order, invalid rows dropped."""
    import torch

    manifest = read_manifest(folder)
    chunks = [read_chunk(chunk_file(folder, i)) for i in range(manifest["chunks"])]
    theta = torch.cat([theta for theta, _ in chunks])
    x = torch.cat([x for _, x in chunks])
    valid = torch.isfinite(x).all(dim=1)
    if not bool(valid.all()):
        if not drop_invalid:
            check_invalid(folder, drop_invalid)
        theta, x = theta[valid], x[valid]
    return theta, x
