"""Split types and the rule for keeping a data set on the accelerator."""

from __future__ import annotations

import pytest
import torch

from trainforge.data.types import TensorData, keep_on_device


def test_tensor_data_holds_its_tensors_in_order_and_is_as_long_as_them() -> None:
    images, labels = torch.zeros(7, 3), torch.zeros(7)
    data = TensorData(images, labels)
    assert len(data) == 7 and data.tensors == (images, labels)
    assert data.nbytes == images.nbytes + labels.nbytes and data.device == images.device
    assert len(TensorData(torch.zeros(5, 2))) == 5  # any number of tensors, even one


def test_tensor_data_refuses_tensors_of_different_lengths_or_none() -> None:
    with pytest.raises(ValueError, match=r"differ in length: \[7, 6\]"):
        TensorData(torch.zeros(7, 3), torch.zeros(6))
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorData()


@pytest.mark.parametrize("setting", ["auto", "true", "false"])
def test_nothing_moves_to_a_cpu_device(setting: str) -> None:
    assert keep_on_device(setting, 10, torch.device("cpu")) is False


@pytest.mark.gpu
def test_auto_keeps_what_leaves_most_of_the_gpu_free() -> None:
    device = torch.device("cuda", 0)
    free, _ = torch.cuda.mem_get_info(device)
    assert keep_on_device("auto", int(0.1 * free), device)
    assert not keep_on_device("auto", int(0.5 * free), device)
    assert keep_on_device("true", int(0.9 * free), device)
    assert not keep_on_device("false", 1, device)
