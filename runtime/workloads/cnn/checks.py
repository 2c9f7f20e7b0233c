"""What the driver checks of a CNN recipe before any worker starts — names in the family's
registries, the data set where the recipe says, torchvision where a model needs it — and the
facts those checks share with the loaders. No torch here: a CNN command's driver checks its
recipe without importing torch (~1 s of every command); the worker's modules (datasets,
models, workload) import these names from here."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainforge.config.schema import Recipe
from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads.cnn.config import CNNWorkloadConfig

KNOWN_DATASETS = ("digits", "synthetic", "cifar10", "imagefolder")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_TRAIN_IMAGES = 50_000
DIGITS_IMAGES = 1797  # scikit-learn's bundled 8x8 digits

KNOWN_MODELS = ("simple_cnn", "resnet18_cifar")
TORCHVISION_PREFIX = "torchvision:"
VISION_EXTRA_HINT = "pip install 'trainforge[vision]'"


# --------------------------------------------------------------------------- models


def is_users_model(name: str) -> bool:
    """``workload.model`` names the user's own model by import path (``my_pkg.nets:MyNet``)."""
    return ":" in name and not name.startswith(TORCHVISION_PREFIX)


def is_users_dataset(name: str) -> bool:
    """``workload.dataset`` names the user's own data set by import path (``my_pkg.data:make``)."""
    return ":" in name


def check_model_name(name: str) -> None:
    """Validate ``workload.model`` without building anything or importing torchvision."""
    if name in KNOWN_MODELS or is_users_model(name):
        return
    if name.startswith(TORCHVISION_PREFIX):
        if not name[len(TORCHVISION_PREFIX) :].strip():
            raise RecipeError(
                f"workload.model={name!r} names no torchvision model; "
                f"write it as '{TORCHVISION_PREFIX}<name>', e.g. '{TORCHVISION_PREFIX}resnet50'"
            )
        return
    choices = ", ".join([*KNOWN_MODELS, f"{TORCHVISION_PREFIX}<name>", "my_pkg.module:MyNet"])
    message = f"workload.model={name!r} is not a known model; choose one of: {choices}"
    raise RecipeError(message + did_you_mean(name, KNOWN_MODELS))


def check_torchvision_model(name: str) -> None:
    """A ``torchvision:<name>`` model that this torchvision lacks is a recipe error, found
    before any worker starts. Where torchvision is not installed, the name cannot be checked
    here; ``require_torchvision`` (the data check of `train`) refuses the run then."""
    if not name.startswith(TORCHVISION_PREFIX) or importlib.util.find_spec("torchvision") is None:
        return
    check_torchvision_name(import_torchvision(), name[len(TORCHVISION_PREFIX) :].strip())


def require_torchvision(name: str) -> None:
    """On the machine that trains: a ``torchvision:`` model needs torchvision importable."""
    if name.startswith(TORCHVISION_PREFIX):
        import_torchvision()


def check_torchvision_name(torchvision: Any, tv_name: str) -> None:
    available = torchvision.models.list_models(module=torchvision.models)
    if tv_name not in available:
        message = (
            f"workload.model='{TORCHVISION_PREFIX}{tv_name}': torchvision has no classification "
            f"model {tv_name!r}"
        )
        close = difflib.get_close_matches(tv_name, available, n=3)
        if close:
            message += f" (did you mean {', '.join(repr(c) for c in close)}?)"
        examples = ", ".join(sorted(available)[:8])
        message += f"; some available: {examples}, ... ({len(available)} in all)"
        raise RecipeError(message)


def import_torchvision() -> Any:
    try:
        import torchvision
    except Exception as exc:
        # Not just ImportError: a torchvision built for another torch fails at import time
        # with RuntimeError or OSError from its compiled operators.
        raise RecipeError(
            "workload.model='torchvision:...' needs torchvision, which could not be imported "
            f"({type(exc).__name__}: {exc}); {VISION_EXTRA_HINT}"
        ) from exc
    return torchvision


# --------------------------------------------------------------------------- data sets


def check_data(cfg: CNNWorkloadConfig) -> None:
    """Cheap driver-side checks (names and paths, no image decoding) before any worker starts;
    a user's own data set is made and checked by ``users_data.probe``."""
    check_dataset_name(cfg.dataset)
    if cfg.dataset == "cifar10":
        root = require_data_root(cfg)
        if not cifar10_folder(root).is_dir():
            if not cfg.download:
                raise cifar10_missing_error(root)
            _check_torchvision_installed()
        else:
            check_cifar10_files(root)
    elif cfg.dataset == "imagefolder":
        root = require_data_root(cfg)
        train_classes = scan_classes(split_dir(root, "train"))
        val_classes = scan_classes(split_dir(root, "val"))
        check_same_classes(root, train_classes, val_classes)
        for split, classes in (("train", train_classes), ("val", val_classes)):
            for name in classes:
                _require_some_image(root / split / name)
        check_num_classes(cfg, len(train_classes), f"imagefolder tree {root}")


def train_samples(cfg: CNNWorkloadConfig) -> int | None:
    """Training images the data set will hold, known without reading it (None: an image folder,
    counted only by listing it)."""
    if cfg.dataset == "digits":  # scikit-learn's test share is ceil(fraction × n)
        return DIGITS_IMAGES - math.ceil(cfg.val_fraction * DIGITS_IMAGES)
    if cfg.dataset == "synthetic":
        return cfg.synthetic_train_size
    if cfg.dataset == "cifar10":
        return CIFAR10_TRAIN_IMAGES
    return None


def image_channels(cfg: CNNWorkloadConfig) -> int:
    """The channels a data set's images have as the workload feeds them: scikit-learn's digits
    are grey; CIFAR-10, synthetic images and image folders (converted) are RGB; a user's own
    data set's, as the driver found them (RGB until then)."""
    if cfg.in_channels is not None:
        return cfg.in_channels
    return 1 if cfg.dataset == "digits" else 3


def check_dataset_name(name: str) -> None:
    if name not in KNOWN_DATASETS and not is_users_dataset(name):
        raise RecipeError(
            f"workload.dataset: {name!r} is not a known data set"
            f"{did_you_mean(name, KNOWN_DATASETS)}; choose one of: {', '.join(KNOWN_DATASETS)}, "
            "or your own by import path (my_pkg.data:make)"
        )


def require_data_root(cfg: CNNWorkloadConfig) -> Path:
    if not cfg.data_root:
        raise RecipeError(
            f"workload.data_root is not set, but workload.dataset={cfg.dataset!r} reads its "
            "images from there"
        )
    return Path(cfg.data_root).expanduser()


def check_num_classes(cfg: CNNWorkloadConfig, found: int, where: str) -> None:
    if cfg.num_classes != found:
        raise RecipeError(
            f"workload.num_classes={cfg.num_classes} but {where} has {found} classes; "
            f"set workload.num_classes={found}"
        )


def cifar10_folder(root: Path) -> Path:
    return root / CIFAR10_FOLDER


def cifar10_missing_error(root: Path) -> RecipeError:
    return RecipeError(
        f"workload.data_root={str(root)!r}: CIFAR-10 folder {cifar10_folder(root)} does not "
        "exist; set workload.download=true to fetch it there, or point workload.data_root at "
        f"a folder holding {CIFAR10_FOLDER}"
    )


def check_cifar10_files(root: Path) -> None:
    for name in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE):
        path = cifar10_folder(root) / name
        if not path.is_file():
            raise RecipeError(
                f"workload.data_root={str(root)!r}: CIFAR-10 file {path} is missing; the folder "
                f"{cifar10_folder(root)} looks incomplete (delete it and set "
                "workload.download=true to fetch it again)"
            )


def _check_torchvision_installed() -> None:
    if importlib.util.find_spec("torchvision") is None:
        raise RecipeError(
            "workload.download=true needs torchvision to fetch CIFAR-10; "
            "pip install 'trainforge[vision]'"
        )


def split_dir(root: Path, split: str) -> Path:
    if not root.is_dir():
        raise RecipeError(f"workload.data_root={str(root)!r}: folder {root} does not exist")
    folder = root / split
    if not folder.is_dir():
        raise RecipeError(
            f"workload.data_root={str(root)!r}: imagefolder needs {folder} holding one "
            "sub-folder of images per class, and it does not exist"
        )
    return folder


def scan_classes(split_dir: Path) -> list[str]:
    # Hidden folders (.ipynb_checkpoints, .DS_Store bundles) are tool droppings, not classes.
    classes = sorted(
        entry.name
        for entry in split_dir.iterdir()
        if entry.is_dir() and not entry.name.startswith(".")
    )
    if not classes:
        raise RecipeError(
            f"workload.data_root: {split_dir} has no class sub-folders "
            "(expected <split>/<class>/<images>)"
        )
    return classes


def check_same_classes(root: Path, train: list[str], val: list[str]) -> None:
    if train == val:
        return
    only_train = sorted(set(train) - set(val))
    only_val = sorted(set(val) - set(train))
    raise RecipeError(
        f"workload.data_root={str(root)!r}: train/ and val/ must hold the same class folders; "
        f"only in train: {only_train or 'none'}, only in val: {only_val or 'none'}"
    )


def iter_images(class_dir: Path) -> Iterator[Path]:
    """Image files under ``class_dir`` (recursively), in a stable order."""
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            # Leading-dot files are mostly macOS "._x.jpg" resource forks that PIL can't open.
            if not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS):
                yield Path(dirpath) / name


def _require_some_image(class_dir: Path) -> None:
    if next(iter_images(class_dir), None) is None:
        raise no_images_error(class_dir)


def no_images_error(class_dir: Path) -> RecipeError:
    return RecipeError(
        f"workload.data_root: class folder {class_dir} holds no images "
        f"({', '.join(IMAGE_EXTENSIONS)})"
    )


# --------------------------------------------------------------------------- the spec's checks


def check(cfg: CNNWorkloadConfig, recipe: Recipe) -> None:
    """Names checked against the family's registries (the section checks its own values)."""
    check_model_name(cfg.model)
    check_torchvision_model(cfg.model)
    if cfg.model_kwargs and not is_users_model(cfg.model):
        raise RecipeError(
            f"workload.model_kwargs: arguments for your own model (workload.model by import "
            f"path, my_pkg.module:MyNet); {cfg.model} takes none"
        )
    check_dataset_name(cfg.dataset)
    if cfg.dataset_kwargs and not is_users_dataset(cfg.dataset):
        raise RecipeError(
            f"workload.dataset_kwargs: arguments for your own data set (workload.dataset by "
            f"import path, my_pkg.data:make); {cfg.dataset} takes none"
        )
    if cfg.model.startswith("torchvision:") and cfg.dataset == "digits":
        raise RecipeError(  # the worker would find out only when it builds the model
            f"workload.model: {cfg.model} expects 3-channel (RGB) images, and the digits data "
            "set has 1 channel; use simple_cnn or resnet18_cifar"
        )


def check_machine(cfg: CNNWorkloadConfig) -> None:
    """What `train` needs on this machine: the data set where the recipe says, torchvision for
    a torchvision model."""
    require_torchvision(cfg.model)
    check_data(cfg)
