"""Recipes: the schema (``schema.py``: one typed section per component) and loading
(``load.py``: YAML + ``key=value`` overrides → one validated config, or one RecipeError)."""

from trainforge.config.load import (
    build,
    check_values,
    from_container,
    global_batch,
    load,
    scaled_lr,
    to_container,
    to_yaml,
)

__all__ = [
    "build",
    "check_values",
    "from_container",
    "global_batch",
    "load",
    "scaled_lr",
    "to_container",
    "to_yaml",
]
