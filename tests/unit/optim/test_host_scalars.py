"""The fused update's per-step scalars on CPU: one host tensor, rewritten in place, each value rounded to float32
as ``to_float32`` rounds it (ORT's float arithmetic), values past float32's range giving its infinity."""

from __future__ import annotations

import math

import numpy as np
import torch

from ort_torch_train.optim.adamw import AdamWHostScalars, adamw_step_scalars
from ort_torch_train.optim.adamw_record import AdamWHyperparameters
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.host_scalars import HostScalars


def test_each_write_rounds_every_value_to_float32_in_the_same_tensor():
    host = HostScalars((3,))
    first = host.write((0.1, 1.0 / 3.0, -2.5e-8))
    second = host.write((1e-3, 0.999, 7.0))
    assert first is second is host.tensor
    assert first.dtype == torch.float32 and first.shape == (3,)
    assert [float(v) for v in second] == [to_float32(v) for v in (1e-3, 0.999, 7.0)]


def test_a_zero_dimensional_buffer_holds_one_float():
    host = HostScalars(())
    tensor = host.write(-0.001)
    assert tensor.shape == () and float(tensor) == to_float32(-0.001)
    assert float(host.write(0.5)) == 0.5 and host.tensor is tensor


def test_finite_values_past_float32_become_its_infinity_as_to_float32_gives():
    host = HostScalars((2,))
    written = host.write((1e39, -1e39))
    assert [float(v) for v in written] == [to_float32(1e39), to_float32(-1e39)] == [math.inf, -math.inf]
    assert [float(v) for v in host.write((2.0, 3.0))] == [2.0, 3.0]  # the buffer serves the next step as before


def test_adamw_scalars_written_as_numpy_casts_them():
    hyperparameters = AdamWHyperparameters(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, True).float32()
    host = HostScalars((11,))
    for step in (1, 2, 1000):
        scalars = adamw_step_scalars(hyperparameters, step)
        assert np.array_equal(host.write(scalars).numpy(), np.array(scalars, np.float32))
        assert scalars.decay_after == to_float32(hyperparameters.lr * hyperparameters.weight_decay)
        assert scalars.one_minus_beta2 == to_float32(1.0 - hyperparameters.beta2)


def test_adamw_writer_gives_adamw_step_scalars_bit_for_bit_across_steps_and_learning_rates():
    rng = np.random.default_rng(51)
    writer = AdamWHostScalars()
    cases = [AdamWHyperparameters(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, True)]
    for _ in range(20):
        beta1, beta2 = (float(1.0 - 10.0 ** rng.uniform(-7, -0.1)) for _ in range(2))
        lr, eps, decay = (float(10.0 ** rng.uniform(-8, 1)) for _ in range(3))
        mode = int(rng.integers(0, 2))
        cases.append(AdamWHyperparameters(lr, beta1, beta2, eps, decay, mode, mode == 0 or bool(rng.integers(0, 2))))
    cases.append(AdamWHyperparameters(3.0e38, 0.9999999, 0.999, 1e-8, 0.0, 1, True))  # corrected lr past float32
    for hyperparameters in (h.float32() for h in cases):
        for step in (1, 2, 3, 17, 1000, 123_457, 2**24 + 1):
            tensor = writer.write(hyperparameters, step)
            expected = np.array(adamw_step_scalars(hyperparameters, step), np.float32)
            assert tensor is writer.tensor
            assert tensor.numpy().tobytes() == expected.tobytes(), (hyperparameters, step)
        rescheduled = hyperparameters.with_learning_rate(to_float32(hyperparameters.lr / 3))  # a scheduler's step
        expected = np.array(adamw_step_scalars(rescheduled, 5), np.float32)
        assert writer.write(rescheduled, 5).numpy().tobytes() == expected.tobytes()
