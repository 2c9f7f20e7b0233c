"""Example simulators to name by import path in a recipe (``task: custom``); they ship with the
package, so ``trainforge.workloads.sbi.examples.sir:simulate`` works after ``pip install``."""
