"""The sbi side of the SBI speed benchmark: sbi 0.27's own ``NPE(...).train()`` on two-moons.

Measures what an sbi user gets today: ``NPE(prior, density_estimator="maf", device=...)``,
``append_simulations(θ, x)`` and ``train()`` with sbi's defaults (batch 200, Adam lr 5e-4,
10% validation split, early stopping after 20 epochs without improvement, gradient clip 5.0), on
simulations from the project's own ``two_moons`` task. It is the baseline our trainer is compared
against, in the same invocation on the same machine.

Numbers come from sbi's own per-epoch record (``inference._summary``):

- ``samples_per_s``: ``train_samples · epochs / Σ epoch_durations_sec``. sbi times each epoch
  from the start of its training pass to the end of its validation pass, so this time base is
  the training loop itself (train + validation passes), without network building, data
  splitting and the summary written after training.
- ``samples_per_s_wall``: ``train_samples · epochs / wall_s``, with ``wall_s`` the wall time of
  the whole ``train()`` call (includes the above).
- ``train_samples`` is sbi's split, ``int(0.9 · n)``; sbi's loader drops the last incomplete
  batch, so an epoch sees ``train_samples // 200 · 200`` samples (the same for n = 100k).
- ``time_to_best_s``: cumulative epoch time at the end of the epoch with the best validation loss.
- ``epochs`` counts the epochs sbi ran (entries in its record). sbi 0.27's loop runs
  ``while epoch <= max_num_epochs``, so ``--max-epochs k`` trains k + 1 epochs; k is passed
  through unchanged, as a user would pass it.
- ``wall_s`` of a fresh process includes one-time costs inside ``train()`` (building the MAF, and
  ~1 s for torch's lazy imports on the first ``Adam(...)``): negligible at n = 100k.

Usage (repo root):  python bench/sbi_baseline.py --num-simulations 100000 --out sbi_base.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
try:
    import trainforge  # noqa: F401
except ImportError:  # run as `python bench/sbi_baseline.py` without the package installed
    sys.path.insert(0, str(ROOT))

VALIDATION_FRACTION = 0.1  # sbi's default in `train()`


def simulate_two_moons(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` (θ, x) pairs from the project's two-moons task, CPU float32."""
    from trainforge.workloads.sbi.tasks import get_task

    task = get_task("two_moons")
    g = torch.Generator().manual_seed(seed)
    theta = task.prior_sample(n, g)
    x = task.simulate(theta, g)
    return theta, x


@contextlib.contextmanager
def validation_split(order: Tensor | None) -> Iterator[None]:
    """Make sbi split train/validation by ``order`` (its last 10% validate) instead of its own
    ``torch.randperm``, so that both trainers monitor the same validation set. sbi draws that
    permutation once per ``train()``, as ``torch.randperm(num_examples)``; later calls (its
    samplers' per-epoch shuffles) pass through."""
    if order is None:
        yield
        return
    original = torch.randperm
    used = False

    def randperm(n: int, *args: Any, **kwargs: Any) -> Tensor:
        nonlocal used
        if not used and n == len(order) and not args and "generator" not in kwargs:
            used = True
            return order.clone()
        return original(n, *args, **kwargs)

    torch.randperm = randperm  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.randperm = original
    if not used:
        raise RuntimeError("sbi did not draw its validation split as expected")


def train_sbi(
    theta: Tensor,
    x: Tensor,
    device: str,
    seed: int,
    max_epochs: int | None,
    density_estimator: str = "maf",
    split_order: Tensor | None = None,
) -> dict[str, Any]:
    """Train sbi's NPE with its defaults on ``(theta, x)`` and return timings and losses (and,
    under ``"estimator"``, the trained density estimator, which is not JSON)."""
    import sbi
    from sbi.inference import NPE
    from sbi.utils import BoxUniform

    torch.manual_seed(seed)
    prior = BoxUniform(-torch.ones(2), torch.ones(2), device=device)
    inference = NPE(prior=prior, density_estimator=density_estimator, device=device)
    inference.append_simulations(theta, x)
    train_kwargs: dict[str, Any] = {}
    if max_epochs is not None:
        train_kwargs["max_num_epochs"] = max_epochs

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with validation_split(split_order):
        estimator = inference.train(**train_kwargs)
    if cuda:
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - start

    summary = inference._summary
    val_loss = [float(v) for v in summary["validation_loss"]]
    train_loss = [float(v) for v in summary["training_loss"]]
    epoch_s = [float(v) for v in summary["epoch_durations_sec"]]
    cumulative_s = torch.tensor(epoch_s, dtype=torch.float64).cumsum(0).tolist()
    epochs = len(epoch_s)
    best_epoch = min(range(epochs), key=val_loss.__getitem__)
    n = theta.shape[0]
    train_samples = int((1 - VALIDATION_FRACTION) * n)
    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "density_estimator": density_estimator,
        "num_simulations": n,
        "train_samples": train_samples,
        "training_batch_size": 200,
        "seed": seed,
        "max_epochs": max_epochs,
        "epochs": epochs,
        "sbi_epochs_trained": int(summary["epochs_trained"][-1]),
        "wall_s": wall_s,
        "epoch_time_s": cumulative_s[-1],
        "samples_per_s": train_samples * epochs / cumulative_s[-1],
        "samples_per_s_wall": train_samples * epochs / wall_s,
        "best_val_loss": float(summary["best_validation_loss"][-1]),
        "best_epoch": best_epoch + 1,
        "time_to_best_s": cumulative_s[best_epoch],
        "val_loss": val_loss,
        "train_loss": train_loss,
        "epoch_s": epoch_s,
        "cumulative_s": cumulative_s,
        "sbi": sbi.__version__,
        "torch": torch.__version__,
        "estimator": estimator,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-simulations", type=int, default=100_000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--max-epochs", type=int, default=None, help="sbi's max_num_epochs k (runs k+1 epochs)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--density-estimator", default="maf")
    parser.add_argument("--out", type=Path, default=Path("sbi_baseline.json"))
    args = parser.parse_args()

    theta, x = simulate_two_moons(args.num_simulations, args.seed)
    result = train_sbi(
        theta, x, args.device, args.seed, args.max_epochs, density_estimator=args.density_estimator
    )
    result.pop("estimator")
    result["date"] = time.strftime("%Y-%m-%d")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\nsbi {result['sbi']} NPE/{result['density_estimator']} on {result['gpu'] or 'cpu'}: "
        f"n={result['num_simulations']} epochs={result['epochs']} "
        f"{result['samples_per_s']:,.0f} samples/s (epochs), "
        f"{result['samples_per_s_wall']:,.0f} (wall), wall {result['wall_s']:.1f} s, "
        f"best val loss {result['best_val_loss']:.4f} at epoch {result['best_epoch']} "
        f"({result['time_to_best_s']:.1f} s) -> {args.out}"
    )


if __name__ == "__main__":
    main()
