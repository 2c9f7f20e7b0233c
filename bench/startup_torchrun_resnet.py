"""The anchor of bench/startup.py on GPUs: a hand-written torchrun script for the synthetic
ResNet-18 recipe's configuration — NCCL DDP, its CIFAR-style ResNet-18 (the model class only,
none of the rest of trainforge), random CIFAR-shaped data made on the GPU, bf16 autocast,
channels_last, SGD — timed from the shell to its first optimizer step (it prints
`[anchor] first step` then).

    torchrun --standalone --nproc_per_node=4 bench/startup_torchrun_resnet.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train(device: torch.device) -> None:
    """The steps, in a process group already joined, on ``device`` (a Ray Train worker's too:
    ``startup_raytrain_resnet.py``)."""
    images = torch.randn(51200 // dist.get_world_size(), 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (images.shape[0],), device=device)
    from trainforge.workloads.cnn.models import ResNet18CIFAR  # the recipe's model

    model = ResNet18CIFAR()
    model = model.to(device, memory_format=torch.channels_last)
    model = DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    for step in range(int(os.environ.get("STEPS", "20"))):
        index = torch.randint(0, images.shape[0], (256,), device=device)
        x = images[index].contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0 and dist.get_rank() == 0:
            print(f"[anchor] first step loss {loss.item():.4f}", flush=True)
    torch.cuda.synchronize()


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    train(torch.device("cuda", local_rank))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
