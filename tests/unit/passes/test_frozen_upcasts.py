"""Low-precision frozen parameters upcast inside their ops (passes/frozen_upcasts.py): no float32 copy
of a frozen weight is saved for backward, and losses and adapter gradients stay bitwise the same."""

import gc
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from ort_torch_train.adapters import indexing
from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.lora import LoraConfig
from ort_torch_train.passes.frozen_upcasts import UpcastOperands, upcast_where_used
from ort_torch_train.passes.pipeline import EAGER_PASSES, run_passes
from tests.unit.lora.helpers import data, make_artifacts

CPU = torch.device("cpu")


def _lora_module(directory, dtype: torch.dtype) -> Module:
    """A LoRA Module over a 3-linear MLP with a LayerNorm, its frozen parameters held in ``dtype``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.LayerNorm(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )
    for param in model[1].parameters():  # not ones and zeros, which other float32 tensors may hold
        torch.nn.init.normal_(param)
    make_artifacts(directory, None, model)
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    lora = LoraConfig(r=2, alpha=4, frozen_dtype=dtype)
    return Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", lora=lora)


def _inputs() -> list[torch.Tensor]:
    return [torch.from_numpy(array) for array in data()]


def _frozen_copy_bytes(tensors: list[torch.Tensor], frozen: list[torch.Tensor]) -> int:
    """Bytes of the float32 ``tensors`` whose storage holds a frozen parameter's values upcast."""
    total = 0
    for tensor in tensors:
        try:
            source = tensor.untyped_storage()
        except NotImplementedError:  # another test's functorch wrapper, still alive: no storage of its own
            continue
        if tensor.dtype != torch.float32 or source.device.type != "cpu":
            continue
        storage = torch.tensor([], dtype=torch.float32).set_(source)
        if any(storage.numel() == p.numel() and torch.equal(storage, p.float().flatten()) for p in frozen):
            total += storage.numel() * 4
    return total


def _step(graph, params: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], int, int]:
    """Loss, adapter gradients, bytes of float32 frozen copies saved for backward or alive in Python
    between forward and backward, and how many tensors were saved."""
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    for param in params:
        param.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = graph(*_inputs(), *params)[0]
    frozen = [p for p in params if not p.requires_grad]
    gc.collect()
    alive = [
        o
        for o in gc.get_objects()
        if type(o) in (torch.Tensor, torch.nn.Parameter) and o.dtype == torch.float32 and o.device.type == "cpu"
    ]  # plain tensors: other tests' wrappers (functorch's, fake ones) may be alive too
    copies = _frozen_copy_bytes(saved + alive, frozen)
    loss.backward()
    return loss.detach(), [p.grad for p in params if p.requires_grad], copies, len(saved)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_frozen_weights_are_saved_low_precision_and_results_are_bitwise_equal(tmp_path, dtype) -> None:
    module = _lora_module(tmp_path, dtype)
    engine = module._engine
    params = [engine.training_state.params[name] for name in engine.train_layout.params]
    assert {p.dtype for p in params if not p.requires_grad} == {dtype}
    graph = engine.train_graph
    without = [step for step in EAGER_PASSES if step is not upcast_where_used]
    plain = graph.specialised(_inputs(), params, "plain", lambda m, device: run_passes(m, without, device))
    upcast = graph.specialised(_inputs(), params, "eager", graph.eager_module)

    plain_loss, plain_grads, plain_copies, _ = _step(plain, params)
    loss, grads, copies, saved = _step(upcast, params)
    assert plain_copies >= 16 * 16 * 4  # the old graph kept float32 copies of the frozen weights
    assert copies == 0
    assert sum(isinstance(m, UpcastOperands) for m in upcast.modules()) >= 4  # 3 linears, the LayerNorm
    assert not any(node.target == "to" for node in upcast.graph.nodes)
    assert saved > 0  # the other saved tensors still went through the caller's hooks
    assert torch.equal(loss, plain_loss)
    assert len(grads) == 6 and all(torch.equal(g, p) for g, p in zip(grads, plain_grads))

    with torch.no_grad():  # an eval-style run (no autograd): the same outputs
        assert torch.equal(upcast(*_inputs(), *params)[0], plain(*_inputs(), *params)[0])


def test_a_frozen_weight_changed_before_backward_is_an_error(tmp_path) -> None:
    module = _lora_module(tmp_path, torch.bfloat16)
    engine = module._engine
    params = [engine.training_state.params[name] for name in engine.train_layout.params]
    graph = engine.train_graph.specialised(_inputs(), params, "eager", engine.train_graph.eager_module)
    loss = graph(*_inputs(), *params)[0]
    frozen = next(p for p in params if not p.requires_grad and p.dim() == 2 and p.shape[0] == 16 == p.shape[1])
    with torch.no_grad():
        frozen.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_readers_of_every_kind_get_the_same_values() -> None:
    """A cast read directly, as a method's receiver, by keyword, beside list and slice arguments and inside a list:
    the last keeps its cast, moved next to it; every output and gradient is unchanged."""
    graph = fx.Graph()
    weight, x = graph.placeholder("weight"), graph.placeholder("x")
    weight.meta["val"] = torch.empty(4, 4, dtype=torch.bfloat16, device="meta")
    x.meta["val"] = torch.empty(4, 4, device="meta")
    cast = graph.call_method("to", (weight, torch.float32))
    product = graph.call_function(torch.matmul, (x, cast))
    pieces = graph.call_method("split", (cast, [1, 3]))
    scaled = graph.call_function(torch.mul, (x,), {"other": cast})
    joined = graph.call_function(torch.cat, ([cast, scaled],))
    first = graph.call_function(operator.getitem, (pieces, 0))
    columns = graph.call_function(operator.getitem, (cast, (slice(None), slice(1, None))))
    graph.output((product, joined, first, columns))
    plain = fx.GraphModule(torch.nn.Module(), graph)
    upcast = fx.GraphModule(torch.nn.Module(), fx.Graph())
    upcast.graph = plain.graph.__deepcopy__()
    upcast_where_used(upcast, CPU)
    upcast.recompile()
    kinds = [m.function for m in upcast.modules() if isinstance(m, UpcastOperands)]
    assert kinds == [torch.matmul, "split", torch.mul, operator.getitem]
    cat = next(node for node in upcast.graph.nodes if node.target is torch.cat)
    assert cat.prev.target == "to" and len(cat.prev.users) == 1  # the cast moved to its one reader left

    torch.manual_seed(0)
    weight_value = torch.randn(4, 4).to(torch.bfloat16)
    results = []
    for module in (plain, upcast):
        leaf = torch.randn(4, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        outputs = module(weight_value, leaf)
        sum((o.sum() * (i + 1) for i, o in enumerate(outputs)), torch.zeros(())).backward()
        results.append(([o.detach() for o in outputs], leaf.grad))
    (plain_outputs, plain_grad), (outputs, grad) = results
    assert all(torch.equal(o, p) for o, p in zip(outputs, plain_outputs)) and torch.equal(grad, plain_grad)


def test_selections_read_the_low_precision_table_and_upcast_what_they_select() -> None:
    """An embedding lookup and a Gather of an upcast table select from the bf16 table, then upcast the rows."""
    graph = fx.Graph()
    table, ids = graph.placeholder("table"), graph.placeholder("ids")
    table.meta["val"] = torch.empty(10, 4, dtype=torch.bfloat16, device="meta")
    ids.meta["val"] = torch.empty(2, 3, dtype=torch.int64, device="meta")
    cast = graph.call_method("to", (table, torch.float32))
    looked_up = graph.call_function(F.embedding, (ids, cast))
    gathered = graph.call_function(indexing.gather, (cast, ids, 0, None))
    looked_up.meta["val"] = torch.empty(2, 3, 4, device="meta")
    graph.output((looked_up, gathered))
    plain = fx.GraphModule(torch.nn.Module(), graph)
    upcast = fx.GraphModule(torch.nn.Module(), fx.Graph())
    upcast.graph = plain.graph.__deepcopy__()
    upcast_where_used(upcast, CPU)
    upcast.recompile()

    selections = [n for n in upcast.graph.nodes if n.target in (F.embedding, indexing.gather)]
    assert all(table.name in {getattr(a, "name", None) for a in n.args} for n in selections)
    assert all([u.target for u in n.users] == ["to"] for n in selections)
    assert not [m for m in upcast.modules() if isinstance(m, UpcastOperands)]
    assert selections[0].meta["val"].dtype == torch.bfloat16
    table_value = torch.randn(10, 4).to(torch.bfloat16)
    index = torch.tensor([[0, 9, 3], [1, 2, 2]])
    for got, expected in zip(upcast(table_value, index), plain(table_value, index)):
        assert got.dtype == torch.float32 and torch.equal(got, expected)
