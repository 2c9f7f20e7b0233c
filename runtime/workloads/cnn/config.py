"""Recipe section ``workload`` for CNN image classification (``workload.kind: cnn``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainforge.config.schema import Switch, WorkloadSection
from trainforge.errors import RecipeError


@dataclass
class CNNWorkloadConfig(WorkloadSection):
    FREE_FORM: ClassVar[tuple[str, ...]] = ("model_kwargs", "dataset_kwargs")

    kind: str = "cnn"
    """Workload family tag; selects this schema."""
    model: str = "simple_cnn"
    """simple_cnn | resnet18_cifar | torchvision:<name> (any torchvision classification model)
    | my_pkg.module:MyNet (your own ``nn.Module`` class, or a function returning one, by import
    path; given ``model_kwargs`` and whichever of ``in_channels``, ``num_classes`` and
    ``image_size`` it takes)."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    """Your own model's arguments (``workload.model`` by import path), as nested as it likes."""
    dataset: str = "digits"
    """digits (scikit-learn's bundled 8x8 digits) | synthetic | cifar10 | imagefolder
    | my_pkg.data:make (your own function by import path, returning (train, val): each a tuple
    of tensors (images N×C×H×W, labels N) or a map-style Dataset of (image, label); given
    ``dataset_kwargs`` and whichever of ``seed``, ``image_size`` and ``num_classes`` it takes)."""
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    """Your own data set's arguments (``workload.dataset`` by import path)."""
    data_root: str | None = None
    """Folder of the data set: CIFAR-10 root (holding cifar-10-batches-py) or an ImageFolder root
    (with train/ and val/ sub-folders)."""
    download: bool = False
    """CIFAR-10 only: download into data_root when absent (needs torchvision and internet)."""
    num_classes: int = 10
    """Number of classes (synthetic data; checked against the data set otherwise)."""
    image_size: int = 32
    """Side of the square images fed to the model (synthetic, digits, imagefolder resize to it)."""
    synthetic_train_size: int = 50000
    """Synthetic data: number of training images."""
    synthetic_val_size: int = 10000
    """Synthetic data: number of validation images."""
    val_fraction: float = 0.2
    """digits: fraction held out as the test split (stratified, seeded)."""
    augment: bool = False
    """Random crop (padding 4) and horizontal flip on training batches."""
    data_on_device: Switch = "auto"
    """auto | true | false: keep tensor data sets on the accelerator and augment there."""
    loader_workers: int = 4
    """imagefolder: DataLoader worker processes per training worker (on Ray started from a
    forkserver, not forked from the Ray worker; the server starts with the set-up)."""
    pin_memory: bool = True
    """imagefolder: pinned host memory for faster host-to-GPU copies."""
    label_smoothing: float = 0.0
    """Cross-entropy label smoothing."""
    in_channels: int | None = None
    """Your own data set's image channels (filled in by the driver from its first image): what
    builds the model without the data, e.g. in ``trainforge.load``."""
    code_dir: str | None = None
    """Where the driver found your own model's or data set's module (filled in by the driver):
    the folder Ray's workers elsewhere import it from."""

    def check(self) -> None:
        # Model and data set names are checked by the spec (their registries live with the
        # code); sizes a data set cannot have are checked by its loader (``datasets.py``).
        self.at_least("num_classes", 2)
        self.fraction("val_fraction")
        self.at_least("loader_workers", 0)
        for name in ("image_size", "synthetic_train_size", "synthetic_val_size"):
            self.at_least(name, 1)
        if not 0 <= self.label_smoothing < 1:
            raise RecipeError(
                f"workload.label_smoothing: must be in [0, 1), got {self.label_smoothing}"
            )
