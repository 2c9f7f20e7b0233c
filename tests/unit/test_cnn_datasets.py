from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainforge.errors import RecipeError
from trainforge.workloads.cnn.checks import KNOWN_DATASETS, check_data
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.datasets import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    CNNData,
    TensorSplit,
    augment_batch,
    load_data,
    stratified_split,
)


def _tensor_splits(data: CNNData) -> tuple[TensorSplit, TensorSplit]:
    assert isinstance(data.train, TensorSplit)
    assert isinstance(data.val, TensorSplit)
    return data.train, data.val


# --------------------------------------------------------------------------- names


def test_unknown_dataset_lists_choices() -> None:
    cfg = CNNWorkloadConfig(dataset="mnist")
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError) as info:
            call()
        message = str(info.value)
        assert "workload.dataset" in message
        assert all(name in message for name in KNOWN_DATASETS)


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_check_data_accepts_builtin_sets(dataset: str) -> None:
    check_data(CNNWorkloadConfig(dataset=dataset))


# --------------------------------------------------------------------------- digits


def test_digits_split_shapes_and_dtypes() -> None:
    data = load_data(CNNWorkloadConfig(dataset="digits", val_fraction=0.2), seed=0)
    train, val = _tensor_splits(data)
    assert len(train) + len(val) == 1797
    assert len(val) == 360  # the validation share rounds up (359.4)
    assert train.images.shape == (len(train), 1, 32, 32)
    assert val.images.shape == (len(val), 1, 32, 32)
    assert train.images.dtype == torch.float32
    assert train.labels.dtype == torch.int64
    assert (data.in_channels, data.num_classes, data.image_size) == (1, 10, 32)


def test_digits_split_is_stratified() -> None:
    train, val = _tensor_splits(load_data(CNNWorkloadConfig(dataset="digits"), seed=1))
    train_counts = torch.bincount(train.labels, minlength=10)
    val_counts = torch.bincount(val.labels, minlength=10)
    totals = train_counts + val_counts
    assert torch.all((val_counts - 0.2 * totals).abs() <= 1.0), val_counts


def test_digits_normalised_with_train_statistics() -> None:
    train, val = _tensor_splits(load_data(CNNWorkloadConfig(dataset="digits"), seed=0))
    assert train.images.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert train.images.std().item() == pytest.approx(1.0, abs=1e-3)
    # Same distribution, different statistics: close to, but not exactly, standardised.
    assert abs(val.images.mean().item()) < 0.1
    assert val.images.mean().item() != pytest.approx(0.0, abs=1e-6)


def test_digits_deterministic_per_seed() -> None:
    cfg = CNNWorkloadConfig(dataset="digits")
    a_train, a_val = _tensor_splits(load_data(cfg, seed=3))
    b_train, b_val = _tensor_splits(load_data(cfg, seed=3))
    c_train, _ = _tensor_splits(load_data(cfg, seed=4))
    assert torch.equal(a_train.images, b_train.images)
    assert torch.equal(a_val.labels, b_val.labels)
    assert not torch.equal(a_train.labels, c_train.labels)


def test_digits_are_scikit_learns() -> None:
    """Read from scikit-learn's file without importing it: the same pixels and labels."""
    from sklearn.datasets import load_digits

    from trainforge.workloads.cnn.datasets import _read_digits

    pixels, labels = _read_digits()
    digits = load_digits()
    assert np.array_equal(pixels, digits.data) and np.array_equal(labels, digits.target)


def test_stratified_split_sizes_and_seeds() -> None:
    labels = np.repeat(np.arange(3), [7, 5, 3])  # 15 samples, classes of 7, 5 and 3
    train, val = stratified_split(labels, 0.4, seed=0)
    assert len(val) == 6 and len(train) == 9  # ceil(0.4 x 15)
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(15))
    # floors 2, 2, 1 (5 taken); the one left goes to the largest remainder: class 0's 0.8
    assert np.bincount(labels[val], minlength=3).tolist() == [3, 2, 1]
    again, other = stratified_split(labels, 0.4, seed=0), stratified_split(labels, 0.4, seed=1)
    assert np.array_equal(again[1], val) and not np.array_equal(other[1], val)


def test_stratified_split_refuses_a_class_missing_on_one_side() -> None:
    labels = np.array([0, 0, 0, 0, 1])  # class 1 has one sample: it cannot be on both sides
    with pytest.raises(RecipeError, match=r"workload\.val_fraction=0\.4 cannot split"):
        stratified_split(labels, 0.4, seed=0)
    with pytest.raises(RecipeError, match="every class on both sides"):
        load_data(CNNWorkloadConfig(dataset="digits", val_fraction=0.001), seed=0)


def test_digits_rejects_wrong_num_classes() -> None:
    with pytest.raises(RecipeError, match=r"workload\.num_classes"):
        load_data(CNNWorkloadConfig(dataset="digits", num_classes=5), seed=0)


# --------------------------------------------------------------------------- synthetic


def _synthetic_cfg(**overrides: object) -> CNNWorkloadConfig:
    values: dict[str, object] = {
        "dataset": "synthetic",
        "num_classes": 5,
        "image_size": 8,
        "synthetic_train_size": 64,
        "synthetic_val_size": 16,
    }
    values.update(overrides)
    return CNNWorkloadConfig(**values)  # type: ignore[arg-type]


def test_synthetic_shapes_and_labels() -> None:
    data = load_data(_synthetic_cfg(), seed=0)
    train, val = _tensor_splits(data)
    assert train.images.shape == (64, 3, 8, 8)
    assert val.images.shape == (16, 3, 8, 8)
    assert train.images.dtype == torch.float32
    assert train.labels.dtype == torch.int64
    labels = torch.cat([train.labels, val.labels])
    assert set(labels.tolist()) == set(range(5))  # every class of 5, and nothing else
    assert (data.in_channels, data.num_classes, data.image_size) == (3, 5, 8)


def test_synthetic_is_noise_not_zeros() -> None:
    train, _ = _tensor_splits(load_data(_synthetic_cfg(), seed=0))
    assert train.images.abs().sum() > 0
    assert 0.8 < train.images.std().item() < 1.2


def test_synthetic_deterministic_per_seed() -> None:
    a_train, a_val = _tensor_splits(load_data(_synthetic_cfg(), seed=7))
    b_train, b_val = _tensor_splits(load_data(_synthetic_cfg(), seed=7))
    c_train, _ = _tensor_splits(load_data(_synthetic_cfg(), seed=8))
    assert torch.equal(a_train.images, b_train.images)
    assert torch.equal(a_train.labels, b_train.labels)
    assert torch.equal(a_val.images, b_val.images)
    assert not torch.equal(a_train.images, c_train.images)
    # Train and val are different draws, not copies.
    assert not torch.equal(a_train.images[:16], a_val.images)


def test_synthetic_generated_on_requested_device() -> None:
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    train, val = _tensor_splits(load_data(_synthetic_cfg(), seed=0, device=device))
    assert train.images.device.type == device.type
    assert val.labels.device.type == device.type


def test_synthetic_rejects_empty_sizes() -> None:
    # The section checks itself when built: such a config never reaches a loader.
    with pytest.raises(RecipeError, match=r"workload\.synthetic_train_size: must be >= 1"):
        _synthetic_cfg(synthetic_train_size=0)


# --------------------------------------------------------------------------- CIFAR-10


def _write_cifar_batch(path: Path, rng: np.random.Generator, first_label: int) -> np.ndarray:
    # Each channel plane is one constant, so a wrong (HWC) reshape would show up as
    # non-constant planes after loading.
    n = 6
    channel_values = rng.integers(0, 256, size=(n, 3), dtype=np.uint8)
    data = np.repeat(channel_values, 1024, axis=1)
    labels = [(first_label + i) % 10 for i in range(n)]
    with path.open("wb") as handle:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"fake"}, handle)
    return channel_values


def _fake_cifar_root(tmp_path: Path) -> Path:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        _write_cifar_batch(folder / f"data_batch_{i}", rng, first_label=i)
    _write_cifar_batch(folder / "test_batch", rng, first_label=0)
    return tmp_path


def test_cifar10_reads_pickle_layout(tmp_path: Path) -> None:
    root = _fake_cifar_root(tmp_path)
    cfg = CNNWorkloadConfig(dataset="cifar10", data_root=str(root))
    check_data(cfg)
    data = load_data(cfg, seed=0)
    train, val = _tensor_splits(data)
    assert train.images.shape == (30, 3, 32, 32)
    assert val.images.shape == (6, 3, 32, 32)
    expected_train = [(b + i) % 10 for b in range(1, 6) for i in range(6)]
    assert train.labels.tolist() == expected_train
    assert val.labels.tolist() == list(range(6))
    assert train.labels.dtype == torch.int64
    assert (data.in_channels, data.num_classes, data.image_size) == (3, 10, 32)
    planes = train.images.flatten(2)
    assert torch.allclose(planes, planes[:, :, :1].expand_as(planes))


def test_cifar10_normalised_per_channel_with_train_stats(tmp_path: Path) -> None:
    root = _fake_cifar_root(tmp_path)
    train, val = _tensor_splits(
        load_data(CNNWorkloadConfig(dataset="cifar10", data_root=str(root)), seed=0)
    )
    means = train.images.mean(dim=(0, 2, 3))
    stds = train.images.std(dim=(0, 2, 3))
    assert torch.allclose(means, torch.zeros(3), atol=1e-4)
    assert torch.allclose(stds, torch.ones(3), atol=1e-3)
    assert not torch.allclose(val.images.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-3)


def test_cifar10_missing_folder_names_key_and_path(tmp_path: Path) -> None:
    cfg = CNNWorkloadConfig(dataset="cifar10", data_root=str(tmp_path / "nowhere"))
    expected_path = str(tmp_path / "nowhere" / "cifar-10-batches-py")
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError) as info:
            call()
        message = str(info.value)
        assert "workload.data_root" in message
        assert expected_path in message
        assert "workload.download=true" in message


def test_cifar10_missing_batch_file_named(tmp_path: Path) -> None:
    root = _fake_cifar_root(tmp_path)
    missing = root / "cifar-10-batches-py" / "data_batch_3"
    missing.unlink()
    cfg = CNNWorkloadConfig(dataset="cifar10", data_root=str(root))
    with pytest.raises(RecipeError, match="data_batch_3"):
        check_data(cfg)
    with pytest.raises(RecipeError, match="data_batch_3"):
        load_data(cfg, seed=0)


def test_cifar10_corrupt_batch_is_recipe_error(tmp_path: Path) -> None:
    root = _fake_cifar_root(tmp_path)
    (root / "cifar-10-batches-py" / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(RecipeError, match="test_batch"):
        load_data(CNNWorkloadConfig(dataset="cifar10", data_root=str(root)), seed=0)


@pytest.mark.parametrize("dataset", ["cifar10", "imagefolder"])
def test_unset_data_root_is_recipe_error(dataset: str) -> None:
    cfg = CNNWorkloadConfig(dataset=dataset, data_root=None)
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError, match=r"workload\.data_root"):
            call()


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="needs torchvision absent"
)
def test_cifar10_download_without_torchvision(tmp_path: Path) -> None:
    cfg = CNNWorkloadConfig(dataset="cifar10", data_root=str(tmp_path), download=True)
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError, match=r"trainforge\[vision\]"):
            call()


# --------------------------------------------------------------------------- ImageFolder

RED = (255, 0, 0)
BLUE = (0, 0, 255)


def _save_image(path: Path, color: tuple[int, int, int], size: tuple[int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def _fake_imagefolder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    # "cat" images are red, "dog" images blue, so a label can be checked against its pixels.
    for i in range(3):
        _save_image(root / "train" / "cat" / f"c{i}.png", RED, (10 + i, 12))
    _save_image(root / "train" / "dog" / "d0.PNG", BLUE, (20, 7))
    _save_image(root / "train" / "dog" / "nested" / "d1.png", BLUE, (9, 9))
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    _save_image(root / "val" / "cat" / "c.png", RED, (16, 16))
    _save_image(root / "val" / "dog" / "d.png", BLUE, (16, 16))
    return root


def _imagefolder_cfg(root: Path, **overrides: object) -> CNNWorkloadConfig:
    values: dict[str, object] = {
        "dataset": "imagefolder",
        "data_root": str(root),
        "num_classes": 2,
        "image_size": 8,
    }
    values.update(overrides)
    return CNNWorkloadConfig(**values)  # type: ignore[arg-type]


def test_imagefolder_items(tmp_path: Path) -> None:
    cfg = _imagefolder_cfg(_fake_imagefolder(tmp_path))
    check_data(cfg)
    data = load_data(cfg, seed=0)
    assert (data.in_channels, data.num_classes, data.image_size) == (3, 2, 8)
    assert len(data.train) == 5  # type: ignore[arg-type]
    assert len(data.val) == 2  # type: ignore[arg-type]
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    labels = []
    for i in range(len(data.train)):  # type: ignore[arg-type]
        image, label = data.train[i]
        assert image.shape == (3, 8, 8)
        assert image.dtype == torch.float32
        assert isinstance(label, int)
        labels.append(label)
        color = RED if label == 0 else BLUE
        expected = (torch.tensor(color, dtype=torch.float32).view(3, 1, 1) / 255 - mean) / std
        assert torch.allclose(image, expected.expand(3, 8, 8), atol=1e-5)
    assert sorted(labels) == [0, 0, 0, 1, 1]
    assert [data.val[i][1] for i in range(2)] == [0, 1]


def test_imagefolder_missing_val(tmp_path: Path) -> None:
    root = _fake_imagefolder(tmp_path)
    for path in (root / "val").rglob("*.png"):
        path.unlink()
    for folder in sorted((root / "val").rglob("*"), reverse=True):
        folder.rmdir()
    (root / "val").rmdir()
    cfg = _imagefolder_cfg(root)
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError) as info:
            call()
        assert "workload.data_root" in str(info.value)
        assert str(root / "val") in str(info.value)


def test_imagefolder_missing_root(tmp_path: Path) -> None:
    cfg = _imagefolder_cfg(tmp_path / "absent")
    with pytest.raises(RecipeError, match="does not exist"):
        check_data(cfg)


def test_imagefolder_empty_class_folder(tmp_path: Path) -> None:
    root = _fake_imagefolder(tmp_path)
    (root / "train" / "bird").mkdir()
    (root / "val" / "bird").mkdir()
    _save_image(root / "val" / "bird" / "b.png", RED, (4, 4))
    cfg = _imagefolder_cfg(root, num_classes=3)
    for call in (lambda: check_data(cfg), lambda: load_data(cfg, seed=0)):
        with pytest.raises(RecipeError, match="holds no images") as info:
            call()
        assert str(root / "train" / "bird") in str(info.value)


def test_imagefolder_class_mismatch(tmp_path: Path) -> None:
    root = _fake_imagefolder(tmp_path)
    _save_image(root / "val" / "bird" / "b.png", RED, (4, 4))
    with pytest.raises(RecipeError, match="only in val: \\['bird'\\]"):
        load_data(_imagefolder_cfg(root), seed=0)


def test_imagefolder_without_classes(tmp_path: Path) -> None:
    root = tmp_path / "images"
    (root / "train").mkdir(parents=True)
    (root / "val").mkdir()
    with pytest.raises(RecipeError, match="no class sub-folders"):
        check_data(_imagefolder_cfg(root))


def test_imagefolder_num_classes_checked(tmp_path: Path) -> None:
    cfg = _imagefolder_cfg(_fake_imagefolder(tmp_path), num_classes=10)
    with pytest.raises(RecipeError, match=r"workload\.num_classes=2"):
        check_data(cfg)


# --------------------------------------------------------------------------- augment_batch


def _augment_seeded(images: torch.Tensor, padding: int, seed: int) -> torch.Tensor:
    # fork_rng keeps the seeding from leaking into other tests.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return augment_batch(images, padding=padding)


def test_augment_preserves_shape_and_dtype() -> None:
    images = torch.randn(5, 3, 12, 10)
    for padding in (0, 4):
        out = _augment_seeded(images, padding, seed=0)
        assert out.shape == images.shape
        assert out.dtype == images.dtype
    half = images.to(torch.float16)
    assert _augment_seeded(half, 4, seed=0).dtype == torch.float16


def test_augment_without_padding_only_flips() -> None:
    images = torch.randn(32, 3, 8, 8)
    out = _augment_seeded(images, padding=0, seed=0)
    flipped = torch.flip(images, dims=[3])
    same = (out == images).flatten(1).all(dim=1)
    is_flipped = (out == flipped).flatten(1).all(dim=1)
    assert torch.all(same | is_flipped)
    assert 0 < int(is_flipped.sum()) < 32


def _matching_crop(padded: torch.Tensor, out: torch.Tensor, padding: int) -> tuple[int, int, bool]:
    """The (top, left, flipped) placement of ``out`` inside ``padded``, or an AssertionError."""
    h, w = out.shape[-2:]
    for top in range(2 * padding + 1):
        for left in range(2 * padding + 1):
            crop = padded[:, top : top + h, left : left + w]
            if torch.equal(crop, out):
                return top, left, False
            if torch.equal(torch.flip(crop, dims=[2]), out):
                return top, left, True
    raise AssertionError("output is not a (flipped) crop of the padded image")


def test_augment_crops_and_flips_each_image_independently() -> None:
    padding = 4
    images = torch.randn(16, 3, 8, 8)
    out = _augment_seeded(images, padding, seed=1)
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    placements = [_matching_crop(padded[i], out[i], padding) for i in range(len(images))]
    assert any(flipped for _, _, flipped in placements)
    assert not all(flipped for _, _, flipped in placements)
    shifts = {(top, left) for top, left, _ in placements}
    assert len(shifts) > 1
    assert any(shift != (padding, padding) for shift in shifts)


def test_augment_is_seeded_by_torch_rng() -> None:
    images = torch.randn(8, 3, 8, 8)
    first = _augment_seeded(images, 4, seed=5)
    again = _augment_seeded(images, 4, seed=5)
    other = _augment_seeded(images, 4, seed=6)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_augment_does_not_modify_input() -> None:
    images = torch.randn(4, 3, 8, 8)
    before = images.clone()
    _augment_seeded(images, 4, seed=0)
    assert torch.equal(images, before)
