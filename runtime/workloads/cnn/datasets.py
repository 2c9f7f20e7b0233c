"""Data sets for the CNN workload, chosen by the recipe key ``workload.dataset``.

Small data sets (digits, synthetic, CIFAR-10) come back as whole normalised tensors, so the
trainer can keep them on the accelerator and slice batches without a DataLoader. ImageFolder
trees can be arbitrarily large and come back as lazily decoding map-style ``Dataset``s.
"""

from __future__ import annotations

import importlib.util
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from trainforge.errors import RecipeError
from trainforge.workloads.cnn.checks import (
    CIFAR10_TEST_FILE,
    CIFAR10_TRAIN_FILES,
    check_cifar10_files,
    check_dataset_name,
    check_num_classes,
    check_same_classes,
    cifar10_folder,
    cifar10_missing_error,
    iter_images,
    no_images_error,
    require_data_root,
    scan_classes,
    split_dir,
)
from trainforge.workloads.cnn.config import CNNWorkloadConfig

CIFAR10_NUM_CLASSES = 10
CIFAR10_IMAGE_SIZE = 32

# ImageFolder trees are usually photos, for which the ImageNet statistics are the convention
# (and what torchvision's pretrained models expect); computing per-tree statistics would need
# a full pass over possibly millions of files.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class TensorSplit:
    """A whole split held in memory."""

    images: torch.Tensor
    """float32 N×C×H×W, already normalised."""
    labels: torch.Tensor
    """int64 N."""

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class CNNData:
    train: TensorSplit | Dataset
    """A TensorSplit, or a Dataset whose items are (float32 C×H×W normalised tensor, int label)."""
    val: TensorSplit | Dataset
    in_channels: int
    num_classes: int
    image_size: int


# --------------------------------------------------------------------------- entry points


def load_data(cfg: CNNWorkloadConfig, seed: int, device: torch.device | None = None) -> CNNData:
    """Load the data set named by ``workload.dataset``.

    ``seed`` fixes the digits split and the synthetic data. ``device`` is only used by the
    synthetic data set, which is generated there directly; everything else comes back on CPU.
    """
    check_dataset_name(cfg.dataset)
    if cfg.dataset == "digits":
        return _load_digits(cfg, seed)
    if cfg.dataset == "synthetic":
        return _load_synthetic(cfg, seed, device)
    if cfg.dataset == "cifar10":
        return _load_cifar10(cfg)
    return _load_imagefolder(cfg)


def augment_batch(images: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``padding``) and random horizontal flip, per image.

    Runs on the batch's own device with that device's default RNG, as one gather: no Python
    loop over images, so it stays cheap on the GPU.
    """
    if images.dim() != 4:
        raise ValueError(f"augment_batch expects an N×C×H×W batch, got shape {tuple(images.shape)}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    n, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (padding, padding, padding, padding)) if padding else images
    top = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    left = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    flip = torch.rand(n, 1, device=device) < 0.5
    rows = top + torch.arange(h, device=device)
    across = torch.arange(w, device=device)
    # Folding the flip into the column index makes crop and flip a single gather.
    cols = left + torch.where(flip, (w - 1) - across, across)
    batch_idx = torch.arange(n, device=device).view(n, 1, 1, 1)
    channel_idx = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch_idx, channel_idx, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


def _normalise_per_channel(train: torch.Tensor, val: torch.Tensor) -> None:
    """Normalise both splits in place with the train split's per-channel statistics."""
    # Statistics from train only, so nothing about the held-out split leaks into training.
    dims = (0, 2, 3)
    mean = train.mean(dim=dims, keepdim=True)
    std = train.std(dim=dims, keepdim=True).clamp_min(1e-8)
    for split in (train, val):
        split.sub_(mean).div_(std)


# --------------------------------------------------------------------------- digits


def _load_digits(cfg: CNNWorkloadConfig, seed: int) -> CNNData:
    check_num_classes(cfg, 10, "the digits data set")
    pixels, labels = _read_digits()
    # The 8x8 pixels hold counts 0..16.
    small = torch.from_numpy(pixels.reshape(-1, 8, 8).astype(np.float32) / 16.0).unsqueeze(1)
    images = F.interpolate(
        small, size=(cfg.image_size, cfg.image_size), mode="bilinear", align_corners=False
    )
    train_idx, val_idx = stratified_split(labels, cfg.val_fraction, seed)
    train_idx_t = torch.from_numpy(train_idx)
    val_idx_t = torch.from_numpy(val_idx)
    train_images, val_images = images[train_idx_t], images[val_idx_t]
    _normalise_per_channel(train_images, val_images)
    all_labels = torch.from_numpy(labels)
    return CNNData(
        train=TensorSplit(train_images, all_labels[train_idx_t]),
        val=TensorSplit(val_images, all_labels[val_idx_t]),
        in_channels=1,
        num_classes=10,
        image_size=cfg.image_size,
    )


def _read_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (64 pixel columns and the label, one row per image),
    read from its file: importing scikit-learn to load them cost each worker 1-2 s of start-up
    on this project's 2-core CPU."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RecipeError("workload.dataset: digits needs scikit-learn installed (it ships them)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    rows = np.loadtxt(path, delimiter=",", dtype=np.float64)
    return rows[:, :-1], rows[:, -1].astype(np.int64)


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Indices (train, validation) with ``ceil(fraction × n)`` samples in validation and each
    class's share within one sample of ``fraction`` of it: every class gets the floor of its
    share, and the samples left go one each to the classes with the largest remainders (ties
    in a seeded order); within a class the samples are drawn in a seeded order. Refused when
    a class would be missing on either side."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    total = math.ceil(round(fraction * len(labels), 9))  # 0.4 × 15 is 6.000000000000001
    shares = counts * fraction
    taken = np.floor(shares).astype(np.int64)
    tie_order = rng.permutation(len(classes))
    by_remainder = sorted(tie_order, key=lambda c: -(shares[c] - taken[c]))
    for c in by_remainder[: max(0, total - int(taken.sum()))]:
        taken[c] += 1
    if np.any(taken < 1) or np.any(taken > counts - 1):
        raise RecipeError(
            f"workload.val_fraction={fraction} cannot split the digits data set "
            f"({len(labels)} images, {len(classes)} classes) with every class on both sides"
        )
    train, val = [], []
    for c, label in enumerate(classes):
        members = rng.permutation(np.flatnonzero(labels == label))
        val.append(members[: taken[c]])
        train.append(members[taken[c] :])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


# --------------------------------------------------------------------------- synthetic


def _load_synthetic(cfg: CNNWorkloadConfig, seed: int, device: torch.device | None) -> CNNData:
    device = torch.device("cpu") if device is None else torch.device(device)
    # A generator of the target device's type lets CUDA fill the tensors in place instead of
    # building hundreds of MB on the host and copying them over. Its stream differs from the
    # CPU one, so the same seed gives different (but still reproducible) data per device type.
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return CNNData(
        train=_random_split(cfg, cfg.synthetic_train_size, generator, device),
        val=_random_split(cfg, cfg.synthetic_val_size, generator, device),
        in_channels=3,
        num_classes=cfg.num_classes,
        image_size=cfg.image_size,
    )


def _random_split(
    cfg: CNNWorkloadConfig, size: int, generator: torch.Generator, device: torch.device
) -> TensorSplit:
    shape = (size, 3, cfg.image_size, cfg.image_size)
    images = torch.randn(shape, generator=generator, device=device)
    labels = torch.randint(0, cfg.num_classes, (size,), generator=generator, device=device)
    return TensorSplit(images, labels)


# --------------------------------------------------------------------------- CIFAR-10


def _load_cifar10(cfg: CNNWorkloadConfig) -> CNNData:
    root = require_data_root(cfg)
    check_num_classes(cfg, CIFAR10_NUM_CLASSES, "CIFAR-10")
    if not cifar10_folder(root).is_dir():
        if not cfg.download:
            raise cifar10_missing_error(root)
        _download_cifar10(root)
    check_cifar10_files(root)
    folder = cifar10_folder(root)
    train_images, train_labels = _read_cifar10_batches(
        root, [folder / name for name in CIFAR10_TRAIN_FILES]
    )
    val_images, val_labels = _read_cifar10_batches(root, [folder / CIFAR10_TEST_FILE])
    _normalise_per_channel(train_images, val_images)
    return CNNData(
        train=TensorSplit(train_images, train_labels),
        val=TensorSplit(val_images, val_labels),
        in_channels=3,
        num_classes=CIFAR10_NUM_CLASSES,
        # The files hold 32x32 images; workload.image_size does not resize them.
        image_size=CIFAR10_IMAGE_SIZE,
    )


def _read_cifar10_batches(root: Path, paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    images: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for path in paths:
        batch = _read_cifar10_batch(root, path)
        images.append(batch[b"data"])
        labels.append(np.asarray(batch[b"labels"], dtype=np.int64))
    # Each row is 3072 bytes, channel-major: 1024 red, then green, then blue.
    pixels = np.concatenate(images).reshape(-1, 3, CIFAR10_IMAGE_SIZE, CIFAR10_IMAGE_SIZE)
    as_float = torch.from_numpy(pixels).float().div_(255.0)
    return as_float, torch.from_numpy(np.concatenate(labels))


def _read_cifar10_batch(root: Path, path: Path) -> dict[bytes, Any]:
    # CIFAR-10's official distribution is pickled; only point data_root at trusted copies.
    try:
        with path.open("rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3 * CIFAR10_IMAGE_SIZE**2:
            raise ValueError(f"b'data' has shape {data.shape}, expected N×3072")
        if len(batch[b"labels"]) != data.shape[0]:
            raise ValueError("b'labels' and b'data' differ in length")
    except Exception as exc:
        raise RecipeError(
            f"workload.data_root={str(root)!r}: {path} is not a readable CIFAR-10 batch "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return {b"data": data, b"labels": batch[b"labels"]}


def _download_cifar10(root: Path) -> None:
    try:
        from torchvision.datasets import CIFAR10
    except Exception as exc:
        raise RecipeError(
            "workload.download=true needs torchvision to fetch CIFAR-10, which could not be "
            f"imported ({type(exc).__name__}: {exc}); pip install 'trainforge[vision]'"
        ) from exc
    try:
        # The archive holds the test batch as well, so fetching the train split is enough.
        CIFAR10(root=str(root), train=True, download=True)
    except Exception as exc:
        raise RecipeError(
            f"workload.download=true: fetching CIFAR-10 into workload.data_root={str(root)!r} "
            f"failed ({type(exc).__name__}: {exc})"
        ) from exc


# --------------------------------------------------------------------------- ImageFolder


class ImageFolderDataset(Dataset):
    """``(path, label)`` pairs decoded with PIL on access, for trees too big for memory.

    Holds only plain attributes so DataLoader worker processes can pickle it.
    """

    def __init__(self, samples: list[tuple[str, int]], classes: list[str], image_size: int):
        self.samples = samples
        self.classes = classes
        self.image_size = image_size
        self._mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize(
                (self.image_size, self.image_size), Image.Resampling.BILINEAR
            )
        pixels = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0)
        tensor = pixels.permute(2, 0, 1)
        return (tensor - self._mean) / self._std, label


def _load_imagefolder(cfg: CNNWorkloadConfig) -> CNNData:
    root = require_data_root(cfg)
    classes = scan_classes(split_dir(root, "train"))
    check_same_classes(root, classes, scan_classes(split_dir(root, "val")))
    check_num_classes(cfg, len(classes), f"imagefolder tree {root}")
    splits = {
        split: ImageFolderDataset(_collect_samples(root / split, classes), classes, cfg.image_size)
        for split in ("train", "val")
    }
    return CNNData(
        train=splits["train"],
        val=splits["val"],
        in_channels=3,
        num_classes=len(classes),
        image_size=cfg.image_size,
    )


def _collect_samples(split_dir: Path, classes: list[str]) -> list[tuple[str, int]]:
    samples: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        found = [(str(path), label) for path in iter_images(split_dir / name)]
        if not found:
            raise no_images_error(split_dir / name)
        samples.extend(found)
    return samples
