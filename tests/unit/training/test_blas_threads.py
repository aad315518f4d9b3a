"""Steps whose matrix products are small run BLAS on one thread (MKL's thread-local count), larger ones
keep torch's threads: the converted graph records its products, and the train and eval steps of a real
artifact see MKL's thread count set and restored."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.convert.matrix_products import ProductRecorder
from ort_torch_train.convert.meta_keys import MATRIX_PRODUCTS
from ort_torch_train.training import blas_threads
from ort_torch_train.training.blas_threads import SERIAL_MACS_PER_THREAD, serial_pays
from tests.helpers.paths import FIXTURES

MLP = FIXTURES / "mlp_ce_adamw_sched"
needs_mkl = pytest.mark.skipif(blas_threads._set_mkl_threads is None, reason="this torch build has no reachable MKL")


def _mkl_threads() -> int:
    return ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so")).MKL_Get_Max_Threads()


@pytest.fixture
def two_threads(restored_threads):
    set_threads(2)  # fixed: the steps' load-following policy would change it on a busy machine


def _mlp_module(directory: Path = MLP / "artifacts") -> tuple[Module, Optimizer]:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    return module, Optimizer(directory / "optimizer_model.onnx", module)


def test_the_converted_graph_records_its_matrix_products():
    module, _ = _mlp_module()
    data = np.load(MLP / "data.npz")
    x, y = torch.from_numpy(data["x_train"][0]), torch.from_numpy(data["y_train"][0])
    module.train()
    module(x, y)
    graph = module.train_graph.module_for([x, y], [module.training_state.params[n] for n in module.train_layout.params])
    batch = x.shape[0]
    assert MATRIX_PRODUCTS.get(graph, None) == [batch * 20 * 32, batch * 32 * 5]  # the two Gemms, in graph order


def test_the_recorder_sizes_every_product_kind_and_gives_up_on_higher_order_ops():
    sizes = []
    a, b, batch = torch.randn(3, 4), torch.randn(4, 5), torch.randn(2, 3, 4)
    with ProductRecorder(sizes) as recorder:
        torch.mm(a, b), torch.addmm(torch.zeros(5), a, b), torch.bmm(batch, batch.transpose(1, 2)), torch.mv(a, b[:, 0])
        torch.einsum("ij,jk->ik", a, b)
    assert sizes == [60, 60, 2 * 3 * 4 * 3, 12, 60] and recorder.complete
    with ProductRecorder([]) as recorder:
        torch.cond(torch.tensor(True), lambda x: x @ x.t(), lambda x: x.t() @ x, (a,))
    assert not recorder.complete


def test_serial_pays_while_the_products_average_under_the_per_thread_share():
    share = SERIAL_MACS_PER_THREAD
    assert serial_pays([32 * 32 * 64] * 10, threads=2)
    assert serial_pays([2 * share - 1], threads=2)
    assert not serial_pays([2 * share], threads=2)
    assert not serial_pays([32 * 32 * 32] * 12 + [1 << 24], threads=2)  # one large product outweighs them
    assert serial_pays([share], threads=4) and not serial_pays([2 * share], threads=4)
    assert not serial_pays([64], threads=1) and not serial_pays([], threads=2)


def _threads_seen_by_steps(module: Module, optimizer: Optimizer, x, y) -> tuple[set[int], set[int]]:
    """MKL's thread count during the backward of train steps and during eval forwards."""
    in_backward, in_eval = set(), set()
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    for param in module.training_state.params.values():
        if param.requires_grad:
            param.register_hook(lambda grad: in_backward.add(_mkl_threads()))
    module.train()
    for _ in range(2):
        module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    module(x, y)
    eval_graph = module.eval_graph.module_for(
        [x, y], [module.training_state.params[n] for n in module.eval_layout.params]
    )
    eval_graph.register_forward_hook(lambda *_: in_eval.add(_mkl_threads()))
    module(x, y)
    return in_backward, in_eval


@needs_mkl
def test_small_product_steps_run_blas_on_one_thread_and_restore_the_count(two_threads):
    module, optimizer = _mlp_module()
    data = np.load(MLP / "data.npz")
    in_backward, in_eval = _threads_seen_by_steps(module, optimizer, data["x_train"][0], data["y_train"][0])
    assert in_backward == {1} and in_eval == {1}
    assert _mkl_threads() == 2


class _Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(512, 512)

    def forward(self, x):
        return self.layer(x)


@needs_mkl
def test_large_product_steps_keep_every_thread(two_threads, tmp_path):
    generate_artifacts(
        _Wide(),
        requires_grad=["layer.weight", "layer.bias"],
        loss=LossType.MSELoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randn(256, 512),),
    )
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    x, y = np.random.default_rng(0).standard_normal((2, 256, 512), dtype=np.float32)
    in_backward, in_eval = _threads_seen_by_steps(module, optimizer, x, y)
    assert in_backward == {2} and in_eval == {2}
