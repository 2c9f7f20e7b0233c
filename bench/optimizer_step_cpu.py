"""The optimizer's step on the CPU, one thread: torch's default implementation there (a loop
over the parameter tensors) against its fused one (one kernel per tensor), which
``optim.build_optimizer`` takes on the CPU as on CUDA.

For each model and optimizer of the shipped recipes (sbi's default MAF with Adam, as in the
two_moons race; the digits CNN with Adam; SGD with Nesterov momentum and weight decay on the
digits CNN and on ResNet-18), the two implementations alternate within each repeat, on the
same gradients; the time is ``optimizer.step()`` alone, the median over the steps after a
warm-up. Their weights after the first 5 steps are compared too: they may differ in the last
bits (the fused kernel rounds in another order); later, a trajectory that turns unstable
amplifies those bits, as any rounding difference would be.

    python bench/optimizer_step_cpu.py --repeats 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.workloads.cnn.models import build_model

STEPS, WARMUP, COMPARED_AFTER = 60, 10, 5


def maf() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from sbi.neural_nets import posterior_nn

    generator = torch.Generator().manual_seed(0)
    theta = torch.rand(1024, 2, generator=generator) * 2 - 1
    x = theta + 0.1 * torch.randn(1024, 2, generator=generator)
    model = posterior_nn(model="maf", hidden_features=50, num_transforms=5)(theta, x)
    return model, lambda net: net.loss(theta, x).mean()


def cnn(name: str, batch: int, channels: int, side: int) -> Any:
    def make() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(batch, channels, side, side, generator=generator)
        labels = torch.randint(0, 10, (batch,), generator=generator)
        model = build_model(name, channels, 10, side)
        return model, lambda net: nn.functional.cross_entropy(net(images), labels)

    return make


def adam(params: Any, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=2e-3, fused=fused or None)


def sgd(params: Any, fused: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4,
                           fused=fused or None)  # fmt: skip


CASES = {
    "maf_adam_batch1024": (maf, adam),
    "simple_cnn_adam_batch32": (cnn("simple_cnn", 32, 1, 16), adam),
    "simple_cnn_sgd_batch32": (cnn("simple_cnn", 32, 1, 16), sgd),
    "resnet18_sgd_batch8": (cnn("resnet18_cifar", 8, 3, 32), sgd),
}


def timed_steps(case: str, fused: bool) -> tuple[float, list[torch.Tensor]]:
    make, optimizer_of = CASES[case]
    torch.manual_seed(0)
    model, loss_of = make()
    optimizer = optimizer_of(model.parameters(), fused)
    times, weights = [], []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model).backward()
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
        if step + 1 == COMPARED_AFTER:
            weights = [p.detach().clone() for p in model.parameters()]
    return statistics.median(times[WARMUP:]) * 1000, weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="optimizer_step_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs: dict[str, dict[str, list[float]]] = {case: {"loop": [], "fused": []} for case in CASES}
    differences: dict[str, float] = {}
    for _ in range(args.repeats):
        for case in CASES:
            loop_ms, loop_weights = timed_steps(case, fused=False)
            fused_ms, fused_weights = timed_steps(case, fused=True)
            runs[case]["loop"].append(round(loop_ms, 4))
            runs[case]["fused"].append(round(fused_ms, 4))
            differences[case] = max(
                float((a - b).abs().max()) for a, b in zip(loop_weights, fused_weights, strict=True)
            )
    medians = {
        case: {kind: statistics.median(values) for kind, values in kinds.items()}
        for case, kinds in runs.items()
    }
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "steps": STEPS, "warmup": WARMUP, "repeats": args.repeats, "runs_ms": runs,
        "medians_ms": medians, "max_weight_difference_after_5_steps": differences,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=2))
    for case, values in medians.items():
        print(f"{case}: loop {values['loop']:.3f} ms, fused {values['fused']:.3f} ms "
              f"({values['loop'] / values['fused']:.2f}x), weights after 5 steps differ by "
              f"at most {differences[case]:.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
