"""The anchor of bench/startup.py on CPU: what a user writes by hand for the digits recipe —
torchrun, gloo DDP, scikit-learn's digits, the tutorial's small CNN, Adam — timed from the shell
to its first optimizer step (it prints `[anchor] first step` then) and to its end.

    torchrun --standalone --nproc_per_node=2 bench/startup_torchrun_digits.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    data = TensorDataset(images, torch.tensor(digits.target))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 2 * 2, 128), nn.ReLU(), nn.Linear(128, 10),
    ))  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for epoch in range(int(os.environ.get("EPOCHS", "2"))):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and epoch == 0 and step == 0:
                print(f"[anchor] first step loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
