"""Recipes: the schema (``schema.py``: one typed section per component, each checking itself),
loading (``load.py``: YAML + ``key=value`` overrides → one typed ``Recipe``, or one RecipeError)
and resolving (``resolve.py``: what the driver decides once it knows the cluster)."""

from trainforge.config.load import (
    build,
    from_container,
    from_mapping,
    global_batch,
    load,
    scaled_lr,
    to_container,
    to_yaml,
)
from trainforge.config.resolve import resolve, resolve_data, resolve_workers
from trainforge.config.schema import Recipe

__all__ = [
    "Recipe",
    "build",
    "from_container",
    "from_mapping",
    "global_batch",
    "load",
    "resolve",
    "resolve_data",
    "resolve_workers",
    "scaled_lr",
    "to_container",
    "to_yaml",
]
