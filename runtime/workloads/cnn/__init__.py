"""CNN image classification (``workload.kind: cnn``): its spec for the workload registry."""

from trainforge.workloads.cnn.workload import SPEC

__all__ = ["SPEC"]
