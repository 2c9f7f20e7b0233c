"""trainforge: a distributed training runtime (import package ``runtime``)."""

__version__ = "0.1.0"
