"""Whether a process finds in the CUDA driver's JIT cache the kernels that an earlier process
compiled, by how the earlier one ended: one step of the synthetic ResNet-18 recipe's model
(bf16 autocast, channels_last, batch 256, cuDNN's autotuning on, whose engines the driver
compiles from PTX), timed, then the process ends as ``--exit`` says — returning normally,
``os._exit`` (no interpreter teardown), SIGTERM or SIGKILL (how a worker is stopped).

    CUDA_CACHE_PATH=/tmp/jc python bench/jit_cache_probe.py --exit sigkill
    CUDA_CACHE_PATH=/tmp/jc python bench/jit_cache_probe.py --exit normal   # finds them?
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch

from trainforge.workloads.cnn.models import ResNet18CIFAR


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", choices=("normal", "os_exit", "sigterm", "sigkill"))
    parser.add_argument("--autotune", choices=("true", "false"), default="true")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.autotune == "true"
    model = ResNet18CIFAR().cuda().to(memory_format=torch.channels_last)
    images = torch.randn(256, 3, 32, 32, device="cuda").contiguous(
        memory_format=torch.channels_last
    )
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(images).float().square().mean()
    loss.backward()
    torch.cuda.synchronize()
    took = round(time.perf_counter() - started, 2)
    seen = {"exit": args.exit, "autotune": args.autotune, "first_step_s": took}
    print(json.dumps(seen), flush=True)
    if args.exit == "os_exit":
        os._exit(0)
    if args.exit in ("sigterm", "sigkill"):
        os.kill(os.getpid(), signal.SIGTERM if args.exit == "sigterm" else signal.SIGKILL)
        time.sleep(10)


if __name__ == "__main__":
    main()
