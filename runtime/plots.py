"""Figures logged as MLflow artifacts (rendered off-screen with matplotlib's Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def learning_curve(history: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Losses on the left axis, accuracy (when present) on the right, against optimizer step."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key in ("train/loss", "val/loss"):
        if history.get(key):
            steps, values = zip(*sorted(history[key]), strict=True)
            ax.plot(steps, values, label=key, marker="o" if key.startswith("val") else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    if history.get("val/accuracy"):
        right = ax.twinx()
        steps, values = zip(*sorted(history["val/accuracy"]), strict=True)
        right.plot(steps, values, color="tab:green", marker="s", label="val/accuracy")
        right.set_ylabel("accuracy")
        right.legend(loc="center right")
    ax.legend(loc="upper right")
    ax.set_title("learning curve")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def confusion_matrix(counts: np.ndarray, path: Path) -> None:
    """Rows: true class, columns: predicted class; cells annotated for up to 20 classes."""
    classes = counts.shape[0]
    fig, ax = plt.subplots(figsize=(1 + 0.45 * classes + 2, 1 + 0.45 * classes), dpi=110)
    image = ax.imshow(counts, cmap="Blues")
    fig.colorbar(image, ax=ax)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"confusion matrix (accuracy {np.trace(counts) / max(counts.sum(), 1):.3f})")
    if classes <= 20:
        ax.set_xticks(range(classes))
        ax.set_yticks(range(classes))
        threshold = counts.max() / 2 if counts.size else 0
        for i in range(classes):
            for j in range(classes):
                color = "white" if counts[i, j] > threshold else "black"
                ax.text(
                    j, i, str(int(counts[i, j])), ha="center", va="center", color=color, fontsize=7
                )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
