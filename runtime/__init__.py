"""trainforge: a distributed training runtime. The source folder is ``runtime/``; the package
installs and imports as ``trainforge``."""

__version__ = "0.1.0"
