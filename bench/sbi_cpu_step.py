"""One CPU training step of sbi's default MAF, with torch's tanh and with trainforge's
(``workloads/sbi/fast_tanh.py``: 2·sigmoid(2x) − 1 on large CPU tensors), in one process.

Both sides are the step the loop takes on the CPU: sbi's MAF built by sbi's builder from
two_moons simulations (trainforge's ``estimator.build``), its NPE loss, fused Adam. Each repeat
times ``--steps`` steps of every (batch, tanh) pair, in a turning order; ms per step are
medians over ``--repeats``. After them both sides train the same ``--check-steps`` steps from the
same weights on the same batches, and the JSON records their validation losses: the same
function, so they must agree.

    OMP_NUM_THREADS=1 python bench/sbi_cpu_step.py --out bench/results/sbi_cpu_step.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the race's setting: one worker, one thread

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sbi_baseline import simulate_two_moons
from sim_scaling import hardware

from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import fast_tanh
from trainforge.workloads.sbi.config import EstimatorSection

SIDES = ("torch_tanh", "fast_tanh")


def model_pair(theta: torch.Tensor, x: torch.Tensor) -> dict[str, Any]:
    """sbi's MAF twice, the same weights; the second on trainforge's tanh."""
    torch.manual_seed(0)
    record = estimators.BuildRecord.from_config(EstimatorSection(model="maf"), 2, 2)
    native = estimators.EstimatorLoss(estimators.build(record, theta, x))
    fast = copy.deepcopy(native)
    assert fast_tanh.use_in(fast) > 0
    return {"torch_tanh": native, "fast_tanh": fast}


def steps(model: torch.nn.Module, optimizer: Any, theta: Any, x: Any, batch: int, n: int) -> None:
    for i in range(n):
        start = (i * batch) % (len(theta) - batch)
        optimizer.zero_grad(set_to_none=True)
        model(theta[start : start + batch], x[start : start + batch]).mean().backward()
        optimizer.step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[200, 1024])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--check-steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("sbi_cpu_step.json"))
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    theta, x = simulate_two_moons(10_000, seed=0)
    train = (theta[:9_000], x[:9_000])
    models = model_pair(*train)
    optimizers = {
        k: torch.optim.Adam(m.parameters(), lr=1e-3, fused=True) for k, m in models.items()
    }
    pairs = [(batch, side) for batch in args.batches for side in SIDES]
    for batch, side in pairs:  # warm-up: first calls allocate and dispatch
        steps(models[side], optimizers[side], *train, batch, 3)
    ms: dict[str, list[float]] = {f"{b}/{s}": [] for b, s in pairs}
    for repeat in range(args.repeats):
        shift = repeat % len(pairs)
        for batch, side in pairs[shift:] + pairs[:shift]:
            started = time.perf_counter()
            steps(models[side], optimizers[side], *train, batch, args.steps)
            ms[f"{batch}/{side}"].append(1000 * (time.perf_counter() - started) / args.steps)
    medians = {key: statistics.median(values) for key, values in ms.items()}
    for batch in args.batches:
        native, fast = medians[f"{batch}/torch_tanh"], medians[f"{batch}/fast_tanh"]
        print(f"batch {batch}: torch tanh {native:.2f} ms/step, trainforge's {fast:.2f} "
              f"({fast / native:.2f}×)")  # fmt: skip
    check = model_pair(*train)
    val_loss = {}
    for side, model in check.items():
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        steps(model, optimizer, *train, 1024, args.check_steps)
        with torch.no_grad():
            val_loss[side] = model(theta[9_000:], x[9_000:]).mean().item()
    print(f"validation loss after {args.check_steps} steps at batch 1,024: {val_loss}")
    document = {
        "hardware": hardware(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "settings": vars(args) | {"out": str(args.out)},
        "ms_per_step_median": medians, "ms_per_step": ms, "val_loss_after_check_steps": val_loss,
        "fast_tanh_min_elements": fast_tanh.MIN_ELEMENTS,
    }  # fmt: skip
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
