"""A shuffling loader across a resume: torchdata's StatefulDataLoader continues its order from the
checkpoint's properties (the resumed run equals one run), a plain shuffled DataLoader gets a warning."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ort_torch_train.trainer import SaveCheckpoints, fit
from tests.unit.trainer.test_fit import cnn_arrays, cnn_module, same_parameters


def cnn_dataset() -> TensorDataset:
    x, y = cnn_arrays()
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def test_stateful_dataloader_resumes_its_shuffled_order(tmp_path) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(seed: int) -> DataLoader:
        torch.manual_seed(seed)  # the sampler draws its own generator's seed from the global one
        return stateful.StatefulDataLoader(cnn_dataset(), batch_size=8, shuffle=True)

    whole, module, optimizer = cnn_module()
    fit(module, optimizer, loader(1), max_steps=26)  # 20 batches per epoch: crosses into epoch 2
    _, module, optimizer = cnn_module()
    fit(module, optimizer, loader(1), max_steps=7, callbacks=[SaveCheckpoints(tmp_path / "ckpt")])
    resumed, module, optimizer = cnn_module(tmp_path / "ckpt")
    fit(module, optimizer, loader(99), max_steps=26)  # another seed: the checkpoint's state decides
    assert same_parameters(whole, resumed)


def test_resuming_a_shuffled_dataloader_without_state_warns(tmp_path, caplog) -> None:
    _, module, optimizer = cnn_module()
    fit(
        module,
        optimizer,
        DataLoader(cnn_dataset(), batch_size=8),
        max_steps=2,
        callbacks=[SaveCheckpoints(tmp_path / "c")],
    )
    _, module, optimizer = cnn_module(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="ort_torch_train"):
        fit(module, optimizer, DataLoader(cnn_dataset(), batch_size=8, shuffle=True), max_steps=3)
    assert "RandomSampler keeps no state" in caplog.text and "array_loader" in caplog.text
    caplog.clear()
    _, module, optimizer = cnn_module(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="ort_torch_train"):
        fit(module, optimizer, DataLoader(cnn_dataset(), batch_size=8), max_steps=3)  # in order: replayable
    assert "keeps no state" not in caplog.text
