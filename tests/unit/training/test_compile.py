"""Module(compile=True): each train step is one compiled graph; Module.step adds the optimizer update to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from ort_torch_train.api import Module, Optimizer
from tests.helpers.corpus import Case
from tests.helpers.paths import FIXTURES

STEPS = 6
# Every deterministic fixture: CE + AdamW, conv + pooling, a transformer layer, frozen parameters, extra
# user outputs, BatchNorm running statistics, MSE + SGD, BCE, L1, a custom loss, AdamW with weight decay.
COMPILED_CASES = (
    "mlp_ce_adamw_sched",
    "cnn",
    "transformer",
    "mlp_frozen",
    "mlp_additional_outputs",
    "bn_frozen_stats",
    "regress_mse_sgd",
    "bce",
    "l1",
    "custom_loss",
    "mlp_optimizers",
)
VARIANTS = ("adamw_wd_clip", "adamw_mode0_wd_clip", "sgd_clip")


def _case(name: str) -> Case:
    if not (FIXTURES / name / "expected.json").is_file():
        pytest.skip(f"fixture {name} not present")
    return Case(FIXTURES / name)


def _module(case: Case, compile: bool) -> Module:
    return Module(
        case.artifact("training_model.onnx"), case.load_state(), case.artifact("eval_model.onnx"), compile=compile
    )


def _train(case: Case, *, compile: bool, fused: bool, optimizer_model=None, steps: int = STEPS):
    """Losses (every user output of every step), eval outputs, parameters, moments and step count."""
    module = _module(case, compile)
    optimizer = Optimizer(optimizer_model or case.artifact("optimizer_model.onnx"), module)
    outputs = []
    for step in range(steps):
        optimizer.set_learning_rate(case.lr_before(step) or 1e-3)
        inputs = case.train_inputs(step)
        if fused:
            result = module.step(optimizer, *inputs)
        else:
            result = module(*inputs)
            optimizer.step()
            module.lazy_reset_grad()
        outputs.append(_listed(result))
    module.eval()
    evaluation = module(*case.eval_inputs())
    state = module.training_state
    moments = {f"{name}/{key}": t.numpy() for name, ms in state.optimizer.momentums.items() for key, t in ms.items()}
    return outputs, evaluation, module.get_contiguous_parameters().numpy(), moments, state.optimizer.step


def _assert_same_training(compiled, eager, atol: float, parameter_atol: float | None = None) -> None:
    """Outputs within ``atol``; parameters and moments within ``parameter_atol`` (default ``atol``)."""
    parameter_atol = atol if parameter_atol is None else parameter_atol
    for step_compiled, step_eager in zip(compiled[0], eager[0], strict=True):
        for a, b in zip(step_compiled, step_eager, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=atol)
    for a, b in zip(_listed(compiled[1]), _listed(eager[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)
    np.testing.assert_allclose(compiled[2], eager[2], rtol=0, atol=parameter_atol)
    assert compiled[3].keys() == eager[3].keys()
    for key in compiled[3]:
        np.testing.assert_allclose(compiled[3][key], eager[3][key], rtol=0, atol=parameter_atol, err_msg=key)
    assert compiled[4] == eager[4] == STEPS


def _listed(outputs) -> list[np.ndarray]:
    return [np.asarray(o) for o in (outputs if isinstance(outputs, tuple) else [outputs])]


@pytest.mark.compile
@pytest.mark.parametrize("name", COMPILED_CASES)
def test_compiled_full_step_matches_eager_in_one_graph(name):
    case = _case(name)
    torch._dynamo.reset()
    counters.clear()
    eager = _train(case, compile=False, fused=False)
    compiled = _train(case, compile=True, fused=True)
    # BatchNorm cancels the gradient of the bias before it: AdamW turns that gradient's rounding noise
    # into lr-sized steps, so that bias (and nothing downstream) differs by float noise (see test_training_parity)
    # The transformer has parameters whose gradient is near zero: AdamW turns a last-bit difference there (the
    # CPU's vector width decides the order of the compiled reductions) into a step of up to 1e-5 as well.
    parameter_atol = 1e-4 if name.startswith("bn_") else 1e-5 if name == "transformer" else None
    _assert_same_training(compiled, eager, atol=2e-6, parameter_atol=parameter_atol)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # the step (each overwrites the gradients) and eval


@pytest.mark.compile
def test_compiled_train_step_and_separate_optimizer_match_eager(mlp_case):
    torch._dynamo.reset()
    counters.clear()
    eager = _train(mlp_case, compile=False, fused=False)
    compiled = _train(mlp_case, compile=True, fused=False)
    _assert_same_training(compiled, eager, atol=1e-6)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # the train step (adding or overwriting alike) and eval


@pytest.mark.compile
@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_update_clips_and_decays_like_the_eager_kernels(variant):
    case = _case("mlp_optimizers")
    optimizer_model = FIXTURES / "mlp_optimizers" / "optimizers" / f"{variant}.onnx"
    eager = _train(case, compile=False, fused=False, optimizer_model=optimizer_model)
    compiled = _train(case, compile=True, fused=True, optimizer_model=optimizer_model)
    _assert_same_training(compiled, eager, atol=2e-6)


def test_module_step_without_compile_is_the_three_calls(mlp_case):
    eager = _train(mlp_case, compile=False, fused=False)
    fused = _train(mlp_case, compile=False, fused=True)
    _assert_same_training(fused, eager, atol=0)


@pytest.mark.compile
def test_compiled_step_accumulates_until_reset_like_eager(mlp_case):
    """Adding to and overwriting the gradients share one compiled graph (the reset is a tensor flag)."""
    inputs = mlp_case.train_inputs(0)
    grads = {}
    for compile in (False, True):
        torch._dynamo.reset()
        counters.clear()
        module = _module(mlp_case, compile)
        module(*inputs)
        module(*inputs)  # accumulates: twice the first gradient
        doubled = [p.grad.clone() for p in module.parameters() if p.requires_grad]
        module.lazy_reset_grad()
        module(*inputs)
        once = [p.grad.clone() for p in module.parameters() if p.requires_grad]
        grads[compile] = (doubled, once)
        module.lazy_reset_grad()
        module(*inputs)
        module.get_parameter(next(n for n, p in module.named_parameters() if p.requires_grad)).grad.fill_(torch.nan)
        module.lazy_reset_grad()
        module(*inputs)  # a reset drops NaN gradients
        assert all(torch.equal(p.grad, g) for p, g in zip((p for p in module.parameters() if p.requires_grad), once))
    assert counters["stats"]["unique_graphs"] == 1
    for compiled, eager in zip(grads[True], grads[False]):
        for a, b in zip(compiled, eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for doubled, once in zip(*grads[True]):
        torch.testing.assert_close(doubled, 2 * once, rtol=1e-5, atol=1e-7)


def test_module_step_refuses_eval_mode_and_foreign_optimizers(mlp_case):
    module = _module(mlp_case, compile=False)
    optimizer = Optimizer(mlp_case.artifact("optimizer_model.onnx"), module)
    module.eval()
    with pytest.raises(RuntimeError, match=r"call module.train\(\) first"):
        module.step(optimizer, *mlp_case.train_inputs(0))
    module.train()
    with pytest.raises(TypeError, match="optimizer: expected an ort_torch_train Optimizer, got SGD"):
        module.step(torch.optim.SGD(module.parameters(), lr=0.1), *mlp_case.train_inputs(0))
    other = Optimizer(mlp_case.artifact("optimizer_model.onnx"), _module(mlp_case, compile=False))
    with pytest.raises(ValueError, match="must update this module's training state"):
        module.step(other, *mlp_case.train_inputs(0))


@pytest.mark.compile
def test_compiled_step_names_bad_labels_and_leaves_the_state_untouched(mlp_case):
    module, reference = _module(mlp_case, compile=True), _module(mlp_case, compile=False)
    x, y = mlp_case.train_inputs(0)
    bad = y.copy()
    bad[0] = 99
    with pytest.raises(IndexError, match=r"class index 99 is out of range, expected 0 <= label < "):
        module(x, bad)
    assert abs(float(module(x, y)) - float(reference(x, y))) < 1e-6
    for name, param in module.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.grad, reference.get_parameter(name).grad, rtol=1e-5, atol=1e-7)


@pytest.mark.compile
def test_compile_takes_torch_compile_arguments(mlp_case):
    torch._dynamo.reset()
    counters.clear()
    eager = _train(mlp_case, compile=False, fused=False)
    module = Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), compile={"backend": "eager"})
    optimizer = Optimizer(mlp_case.artifact("optimizer_model.onnx"), module)
    optimizer.set_learning_rate(mlp_case.lr_before(0) or 1e-3)
    loss = module.step(optimizer, *mlp_case.train_inputs(0))
    assert abs(float(loss) - float(eager[0][0][0])) < 1e-6
    assert counters["stats"]["unique_graphs"] == 1 and dict(counters["graph_break"]) == {}


@pytest.mark.compile
def test_a_compile_mode_step_and_eval_graph_are_precompiled_and_train_like_eager(mlp_case, monkeypatch, tmp_path):
    """``compile=<mode>`` (here one whose CUDA graphs a CPU step does not record) is precompiled as the
    mode's inductor options: one saved step and one saved eval graph, and the eager loop's numbers."""
    from ort_torch_train.training.compile import cache as cache_module

    monkeypatch.setattr(cache_module, "_PROCESS_CACHES", cache_module.ProcessCompileCaches())
    cache_module.load_compile_cache(tmp_path / "cache")  # the compile cache of the Modules built from now on
    eager = _train(mlp_case, compile=False, fused=False)
    compiled = _train(mlp_case, compile="max-autotune", fused=True)
    _assert_same_training(compiled, eager, atol=2e-6)
    cache = cache_module.compile_cache_for()
    assert cache is not None and len(cache.steps) == 2 and cache.store.entry_count() >= 2


@pytest.mark.parametrize("setting", ["", {"mode": None, "fullgraph": False}, 3])
def test_compile_setting_is_checked(mlp_case, setting):
    with pytest.raises(ValueError, match="compile: expected a bool, a torch.compile mode name or a dict"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), compile=setting)


@pytest.mark.compile
def test_compiled_step_specialises_for_a_new_batch_size(mlp_case):
    """A last, smaller batch trains as eager does (with dynamic shapes, in the same compiled step)."""
    losses = {}
    for compile in (False, True):
        module = _module(mlp_case, compile)
        optimizer = Optimizer(mlp_case.artifact("optimizer_model.onnx"), module)
        optimizer.set_learning_rate(1e-2)
        full = mlp_case.train_inputs(0)
        partial = [array[: len(array) // 2 + 1] for array in mlp_case.train_inputs(1)]
        losses[compile] = [float(module.step(optimizer, *batch)) for batch in (full, partial, full, partial)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=0, atol=1e-6)
    assert len(set(losses[True])) == 4


def test_module_step_applies_a_torch_scheduler_learning_rate(mlp_case):
    """With optimizer.torch_optimizer driven by a torch LR scheduler, Module.step uses its current lr."""
    results = []
    for fused in (False, True):
        module = _module(mlp_case, compile=False)
        optimizer = Optimizer(mlp_case.artifact("optimizer_model.onnx"), module)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer.torch_optimizer, step_size=1, gamma=0.5)
        for step in range(3):
            if fused:
                module.step(optimizer, *mlp_case.train_inputs(step))
            else:
                module(*mlp_case.train_inputs(step))
                optimizer.torch_optimizer.step()
                module.lazy_reset_grad()
            scheduler.step()
        results.append((module.get_contiguous_parameters().numpy(), optimizer.get_learning_rate()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1] == pytest.approx(1e-3 / 8)


@pytest.mark.compile
def test_compiled_step_with_dropout_has_no_graph_break():
    """Dropout draws from inductor's RNG when compiled, so only the structure and finiteness are compared."""
    case = _case("bn_dropout")
    torch._dynamo.reset()
    counters.clear()
    outputs = _train(case, compile=True, fused=True)[0]
    assert all(np.isfinite(o).all() for step in outputs for o in step)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # the step (adding or overwriting gradients alike) and eval


def test_cpu_graphs_compile_with_the_cpp_wrapper_unless_told_otherwise():
    from ort_torch_train.training.compile.settings import cpu_post_grad_passes, for_device

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    passes = cpu_post_grad_passes()
    defaults = {"cpp_wrapper": True, "cpp.min_chunk_size": 16384, "post_grad_custom_post_pass": passes}
    assert for_device({}, cpu) == {"options": defaults}
    assert for_device({"options": {"max_autotune": True}}, cpu) == {"options": {**defaults, "max_autotune": True}}
    assert for_device({"options": {"cpp_wrapper": False}}, cpu) == {"options": {**defaults, "cpp_wrapper": False}}
    for kept in ({"mode": "max-autotune"}, {"backend": "aot_eager"}):
        assert for_device(kept, cpu) == kept
    assert for_device({}, cuda) == {}


@pytest.mark.compile
def test_small_biased_products_compile_to_a_product_and_a_fused_add():
    """The CPU defaults' post-grad pass splits a small ``addmm`` so that the bias add joins the next loop."""
    from torch._inductor.utils import run_and_get_code

    from ort_torch_train.training.compile.settings import for_device

    torch._dynamo.reset()
    x, weight, bias = torch.randn(32, 32), torch.randn(64, 32), torch.randn(64)

    def layer(x, weight, bias):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias))

    compiled = torch.compile(layer, fullgraph=True, **for_device({}, torch.device("cpu")))
    output, code = run_and_get_code(compiled, x, weight, bias)
    code = "".join(code)
    assert "addmm_out" not in code and "mm_out" in code and "cpp_fused_addmm_gelu" in code  # bias add + GELU
    torch.testing.assert_close(output, layer(x, weight, bias), atol=1e-5, rtol=1e-5)


@pytest.mark.compile
def test_a_python_wrapper_step_matches_the_default_cpp_wrapper_step():
    case = _case("mlp_ce_adamw_sched")
    losses = []
    for compile in (True, {"options": {"cpp_wrapper": False}}):
        module = _module(case, compile)
        optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
        losses.append([float(module.step(optimizer, *case.train_inputs(step))) for step in range(3)])
    assert losses[0] == losses[1]
