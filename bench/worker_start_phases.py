"""Where a cold GPU worker's start goes: the steps of ``WarmWorker.__init__`` (``worker/warm.py``),
timed one by one in fresh processes, as a cold command's own worker makes them (its process
start, torch's import, the loop's modules, the first optimizer, the CUDA context, the module
list and the frozen collection), then the model on the GPU and its first two steps (the
synthetic ResNet-18 recipe's: bf16 autocast, channels_last, fused SGD, cuDNN autotuning).

Variants, each in its own process, in turning order:
- ``sequential``: the steps in ``WarmWorker``'s order;
- ``cuda_thread``: the CUDA context made on a thread right after torch's import, while the main
  thread imports the loop and makes the first optimizer;
- ``driver_thread``: the CUDA driver started (``cuInit``, the device's primary context) through
  ctypes on a thread at the process's start, before and during torch's import; the runtime then
  finds the primary context made;
- ``gpu_warm_thread``: as ``cuda_thread``, and the thread goes on to load cuDNN and cuBLAS (a
  small bf16 convolution forward and backward, a bf16 matrix product), which release Python's
  lock, while the main thread imports;
- ``sequential_no_autotune``: ``sequential`` with cuDNN's autotuning off (with
  ``CUDA_CACHE_DISABLE=1``: whether the first step's PTX compiling comes from the kernels that
  autotuning tries).

Every time is seconds from the parent's ``Popen`` call. ``--importtime`` adds one
``sequential`` process under ``python -X importtime`` and records its 30 slowest imports
(cumulative).

    CUDA_VISIBLE_DEVICES=0 python bench/worker_start_phases.py --repeats 3 --out phases.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

VARIANTS = (
    "sequential",
    "cuda_thread",
    "driver_thread",
    "gpu_warm_thread",
    "sequential_no_autotune",
)
BATCH = 256


def start_driver() -> threading.Thread:
    """cuInit and device 0's primary context through the driver API, on a thread: ctypes lets
    go of Python's lock during each call."""
    import ctypes

    def run() -> None:
        cuda = ctypes.CDLL("libcuda.so.1")
        device, context = ctypes.c_int(), ctypes.c_void_p()
        assert cuda.cuInit(0) == 0
        assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def warm_gpu_libraries() -> None:
    """The CUDA context, then cuDNN's and cuBLAS's libraries loaded and their handles made."""
    import torch

    torch.backends.cudnn.benchmark = True
    x = torch.randn(8, 64, 8, 8, device="cuda", requires_grad=True)
    weight = torch.randn(64, 64, 3, 3, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = torch.nn.functional.conv2d(x.contiguous(memory_format=torch.channels_last), weight)
        z = y.flatten(1) @ torch.randn(y.shape[1] * y.shape[2] * y.shape[3], 10, device="cuda")
    z.float().sum().backward()
    torch.cuda.synchronize()


def one_process(variant: str, launched_at: float) -> dict[str, float]:
    marks: dict[str, float] = {"interpreter": time.time() - launched_at}

    def mark(name: str) -> None:
        marks[name] = round(time.time() - launched_at, 3)

    driver = start_driver() if variant == "driver_thread" else None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    mark("torch")
    context = None
    if variant == "cuda_thread":
        context = threading.Thread(target=lambda: torch.zeros(1, device="cuda"), daemon=True)
        context.start()
    elif variant == "gpu_warm_thread":
        context = threading.Thread(target=warm_gpu_libraries, daemon=True)
        context.start()
    import trainforge.worker.trainer  # noqa: F401

    mark("loop_modules")
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    mark("first_optimizer")
    if context is not None:
        context.join()
    if driver is not None:
        driver.join()
        mark("driver_joined")
    torch.zeros(1, device="cuda")
    mark("cuda_context")
    from trainforge.worker import warm

    warm._module_files()
    warm.release_run_memory()
    mark("worker_ready")

    from trainforge.workloads.cnn.models import ResNet18CIFAR

    torch.backends.cudnn.benchmark = variant != "sequential_no_autotune"
    device = torch.device("cuda", 0)
    images = torch.randn(BATCH, 3, 32, 32, device=device).contiguous(
        memory_format=torch.channels_last
    )
    labels = torch.randint(0, 10, (BATCH,), device=device)
    model = ResNet18CIFAR().to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    torch.cuda.synchronize()
    mark("model_on_gpu")
    for name in ("first_step", "second_step"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        mark(name)
    return marks


def spawn(variant: str, importtime: bool = False) -> tuple[dict[str, float], str]:
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), __file__,
               "--one", variant, "--launched-at"]  # fmt: skip
    launched_at = time.time()
    done = subprocess.run([*command, repr(launched_at)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def slowest_imports(stderr: str, count: int = 30) -> list[tuple[str, float]]:
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda row: -row[1])[:count]


def arch_list() -> list[str]:
    """The GPU architectures torch's kernels were built for (its machine code, and PTX that the
    driver compiles for others on first use)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_arch_list())"],
                          capture_output=True, text=True)  # fmt: skip
    return [done.stdout.strip(), done.stderr.strip()[-300:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("worker_start_phases.json"))
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one, args.launched_at)))
        return
    variants = args.variants.split(",")
    runs: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    for repeat in range(args.repeats):
        order = variants if repeat % 2 == 0 else variants[::-1]
        for variant in order:
            marks, _ = spawn(variant)
            runs[variant].append(marks)
            print(variant, json.dumps(marks), flush=True)
    medians = {
        variant: {key: round(statistics.median(run[key] for run in rows), 3) for key in rows[0]}
        for variant, rows in runs.items()
    }
    result: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_cache_disable": os.environ.get("CUDA_CACHE_DISABLE"),
            "torch_arch_list": arch_list(),
        },
        "runs": runs,
        "medians": medians,
    }
    if args.importtime:
        marks, stderr = spawn("sequential", importtime=True)
        result["importtime"] = {"marks": marks, "slowest": slowest_imports(stderr)}
        print("importtime", json.dumps(result["importtime"]), flush=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
