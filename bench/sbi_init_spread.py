"""How far sbi's own converged validation loss moves with its initial weights alone (issue 12's
CPU race): sbi 0.27's ``NPE().train()`` with its defaults, on one seed's two_moons simulations
and validation split (made as ``bench/sbi_race_command.py --seed S`` makes them), once per torch
seed given. The race's target is one such run's best loss, and its clock that run's wall time.

    OMP_NUM_THREADS=1 python bench/sbi_init_spread.py --seed 6 --torch-seeds 6 100 101 102 \
        --out spread.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sbi_baseline
from sbi_race_command import make_simulations, simulation_overrides, split_permutation, work_folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the simulations' and split's seed")
    parser.add_argument("--torch-seeds", type=int, nargs="+", required=True)
    parser.add_argument("--simulations", type=int, default=10_000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out = args.out.resolve()
    torch.set_num_threads(1)
    work, env = work_folder("tf-sbi-spread-")
    _, theta, x = make_simulations(simulation_overrides(args.simulations, args.seed), env, work)
    order = split_permutation(len(theta), args.seed)
    rows = []
    for torch_seed in args.torch_seeds:
        run = sbi_baseline.train_sbi(theta, x, "cpu", seed=torch_seed, max_epochs=None,
                                     split_order=order)  # fmt: skip
        rows.append({"torch_seed": torch_seed, "best_val_loss": run["best_val_loss"],
                     "epochs": run["epochs"], "wall_s": round(run["wall_s"], 1)})  # fmt: skip
        print(rows[-1], flush=True)
        document = {"data_seed": args.seed, "simulations": args.simulations,
                    "torch": torch.__version__, "rows": rows}  # fmt: skip
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
