"""The fixtures: torch models, seeded data and the generate_artifacts settings for each.

A fixture's data comes from a fixed numpy seed; targets come from a random "teacher" so the
losses actually go down. Torch weights come from torch.manual_seed(spec.seed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from onnxruntime.training import onnxblock
from torch import nn

STEPS = 20


@dataclass(frozen=True)
class InputSpec:
    """One user input of the base model: ONNX name, data.npz key stem, per-example shape, kind."""

    name: str
    key: str
    shape: tuple[int, ...]
    kind: str = "normal"  # "normal" float data, or "mask" (1.0 for the first L tokens, L >= 3)


@dataclass
class FixtureSpec:
    """Everything make_fixtures.py needs to build and record one fixture."""

    name: str
    description: str
    seed: int
    build_model: Callable[[], nn.Module]
    inputs: list[InputSpec]
    loss: str  # ce | mse | bce | l1 | custom
    target: str  # "classes:<C>" | "regress:<D>" | "binary"
    optimizer: str = "AdamW"  # AdamW | SGD
    lr: float = 0.01
    batch: int = 8
    eval_batch: int = 16
    frozen: Callable[[list[str]], list[str]] = lambda names: []
    scheduler: dict | None = None  # documented semantics: warmup_step_count, total_step_count, initial_lr
    nominal_checkpoint: bool = False
    properties: dict | None = None
    additional_output_names: list[str] | None = None
    stochastic: bool = False  # contains Dropout(p>0): ORT's RNG cannot be matched
    track_frozen_each_step: bool = False  # record frozen params (BN running stats) after every step
    optimizer_variants: bool = False
    ort_format: bool = False  # artifacts_ort/: the models in ORT format and ORT's run on them
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- models


def mlp() -> nn.Module:
    """Linear(20,32)-ReLU-Linear(32,5)."""
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))


def cnn() -> nn.Module:
    """Conv2d(1,4,3)-ReLU-MaxPool2d(2)-Flatten-Linear(100,10) on 1x12x12."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(100, 10))


def regressor() -> nn.Module:
    """Linear(8,16)-Tanh-Linear(16,1)."""
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def logistic() -> nn.Module:
    """Linear(6,1) (logits for BCEWithLogits)."""
    return nn.Sequential(nn.Linear(6, 1))


def l1_regressor() -> nn.Module:
    """Linear(8,16)-ReLU-Linear(16,2): two regression targets."""
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _randomise_bn_stats(model: nn.Module) -> nn.Module:
    """Give BatchNorm non-trivial running stats so eval graphs using them are distinguishable."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    return model


def bn_dropout() -> nn.Module:
    """Linear(12,16)-BatchNorm1d(16)-ReLU-Dropout(0.5)-Linear(16,3)."""
    return _randomise_bn_stats(
        nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    )


def bn_mlp() -> nn.Module:
    """Linear(12,16)-BatchNorm1d(16)-ReLU-Linear(16,3)."""
    return _randomise_bn_stats(nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3)))


class TinyTransformer(nn.Module):
    """TransformerEncoderLayer(16, 2 heads, ff 32, no dropout) + masked mean-pool + Linear(16,4)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        m = mask.unsqueeze(-1)
        return self.head((h * m).sum(dim=1) / m.sum(dim=1))


# ----------------------------------------------------------------------------- custom loss


class WeightedMseL1(onnxblock.Block):
    """0.7 * MSELoss + 0.3 * L1Loss built from onnxblock blocks (both read the same `target`)."""

    def __init__(self, w_mse: float = 0.7, w_l1: float = 0.3) -> None:
        super().__init__()
        self._mse = onnxblock.loss.MSELoss()
        self._l1 = onnxblock.loss.L1Loss()
        self._w_mse = onnxblock.blocks.Constant(w_mse)
        self._w_l1 = onnxblock.blocks.Constant(w_l1)
        self._mul1 = onnxblock.blocks.Mul()
        self._mul2 = onnxblock.blocks.Mul()
        self._add = onnxblock.blocks.Add()

    def build(self, output_name: str, target_name: str = "target") -> str:
        mse = self._mul1(self._w_mse(), self._mse(output_name, target_name))
        l1 = self._mul2(self._w_l1(), self._l1(output_name, target_name))
        return self._add(mse, l1)


def torch_loss(spec: FixtureSpec, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The torch equivalent of the fixture's ORT loss (for first-step cross-checks)."""
    f = nn.functional
    if spec.loss == "ce":
        return f.cross_entropy(out, target)
    if spec.loss == "mse":
        return f.mse_loss(out, target)
    if spec.loss == "bce":
        return f.binary_cross_entropy_with_logits(out, target)
    if spec.loss == "l1":
        return f.l1_loss(out, target)
    if spec.loss == "custom":
        return 0.7 * f.mse_loss(out, target) + 0.3 * f.l1_loss(out, target)
    raise ValueError(spec.loss)


# ----------------------------------------------------------------------------- data


def _make_inputs(rng: np.random.Generator, spec: FixtureSpec, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Random user inputs with leading dims `lead` (e.g. (20, B) or (16,))."""
    out = {}
    for inp in spec.inputs:
        if inp.kind == "mask":
            t = inp.shape[-1]
            lengths = rng.integers(3, t + 1, size=lead)
            out[inp.key] = (np.arange(t) < lengths[..., None]).astype(np.float32)
        else:
            out[inp.key] = rng.standard_normal(lead + inp.shape).astype(np.float32)
    return out


def _features(spec: FixtureSpec, xs: dict[str, np.ndarray], lead: int) -> np.ndarray:
    """Per-example feature vector used by the teacher (masked token mean when there is a mask)."""
    x = xs["x"]
    if "mask" in xs:
        m = xs["mask"][..., None]
        return (x * m).sum(-2) / m.sum(-2)
    return x.reshape(x.shape[:lead] + (-1,))


def _targets(rng: np.random.Generator, spec: FixtureSpec, feats: np.ndarray, teacher: np.ndarray) -> np.ndarray:
    """Targets from a fixed random linear teacher (plus noise for regression)."""
    z = feats @ teacher
    kind, _, n = spec.target.partition(":")
    if kind == "classes":
        return np.argmax(z[..., : int(n)], axis=-1).astype(np.int64)
    if kind == "binary":
        return (z[..., :1] > 0).astype(np.float32)
    noise = 0.05 * rng.standard_normal(z[..., : int(n)].shape)
    return (np.tanh(z[..., : int(n)]) + noise).astype(np.float32)


def make_data(spec: FixtureSpec) -> dict[str, np.ndarray]:
    """data.npz content: <key>_train[20,B,...], y_train[20,B,...], <key>_eval, y_eval."""
    rng = np.random.default_rng(1000 + spec.seed)
    train = _make_inputs(rng, spec, (STEPS, spec.batch))
    evals = _make_inputs(rng, spec, (spec.eval_batch,))
    n_feat = _features(spec, train, 2).shape[-1]
    teacher = rng.standard_normal((n_feat, 16)).astype(np.float32) / np.sqrt(n_feat)
    data = {f"{k}_train": v for k, v in train.items()}
    data["y_train"] = _targets(rng, spec, _features(spec, train, 2), teacher)
    data.update({f"{k}_eval": v for k, v in evals.items()})
    data["y_eval"] = _targets(rng, spec, _features(spec, evals, 1), teacher)
    return data


# ----------------------------------------------------------------------------- the list

_X = [InputSpec("input", "x", (20,))]


def _first_linear(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith("0.")]


def _bn_stats(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(("running_mean", "running_var"))]


FIXTURES: list[FixtureSpec] = [
    FixtureSpec(
        "mlp_ce_adamw_sched",
        "Linear(20,32)-ReLU-Linear(32,5), CrossEntropyLoss, AdamW, LinearLRScheduler "
        "(documented semantics warmup=3, total=20, initial_lr=0.01), nominal checkpoint, properties",
        1,
        mlp,
        _X,
        "ce",
        "classes:5",
        scheduler={"warmup_step_count": 3, "total_step_count": 20, "initial_lr": 0.01},
        nominal_checkpoint=True,
        properties={"epoch": 3, "best_loss": 0.25, "tag": "fixtures"},
        ort_format=True,
    ),
    FixtureSpec(
        "mlp_frozen",
        "Linear(20,32)-ReLU-Linear(32,5), CrossEntropyLoss, AdamW, first Linear frozen",
        2,
        mlp,
        _X,
        "ce",
        "classes:5",
        frozen=_first_linear,
    ),
    FixtureSpec(
        "mlp_additional_outputs",
        "Linear(20,32)-ReLU-Linear(32,5), CrossEntropyLoss, AdamW, additional_output_names=['logits']",
        3,
        mlp,
        _X,
        "ce",
        "classes:5",
        additional_output_names=["logits"],
    ),
    FixtureSpec(
        "cnn",
        "Conv2d(1,4,3)-ReLU-MaxPool2d(2)-Flatten-Linear(100,10), 1x12x12, CrossEntropyLoss, AdamW",
        4,
        cnn,
        [InputSpec("input", "x", (1, 12, 12))],
        "ce",
        "classes:10",
    ),
    FixtureSpec(
        "regress_mse_sgd",
        "Linear(8,16)-Tanh-Linear(16,1), MSELoss, SGD lr 0.05",
        5,
        regressor,
        [InputSpec("input", "x", (8,))],
        "mse",
        "regress:1",
        optimizer="SGD",
        lr=0.05,
    ),
    FixtureSpec(
        "bce", "Linear(6,1), BCEWithLogitsLoss, AdamW", 6, logistic, [InputSpec("input", "x", (6,))], "bce", "binary"
    ),
    FixtureSpec(
        "l1",
        "Linear(8,16)-ReLU-Linear(16,2), L1Loss, AdamW",
        7,
        l1_regressor,
        [InputSpec("input", "x", (8,))],
        "l1",
        "regress:2",
    ),
    FixtureSpec(
        "transformer",
        "TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, "
        "batch_first=True) + masked mean-pool + Linear(16,4), CrossEntropyLoss, AdamW; two user inputs "
        "input[B,6,16] (float) and mask[B,6] (float 0/1)",
        8,
        TinyTransformer,
        [InputSpec("input", "x", (6, 16)), InputSpec("mask", "mask", (6,), "mask")],
        "ce",
        "classes:4",
        batch=4,
        eval_batch=8,
    ),
    FixtureSpec(
        "bn_dropout",
        "Linear(12,16)-BatchNorm1d(16)-ReLU-Dropout(0.5)-Linear(16,3), CrossEntropyLoss, "
        "AdamW; BatchNorm running stats stay constants",
        9,
        bn_dropout,
        [InputSpec("input", "x", (12,))],
        "ce",
        "classes:3",
        stochastic=True,
    ),
    FixtureSpec(
        "bn_frozen_stats",
        "Linear(12,16)-BatchNorm1d(16)-ReLU-Linear(16,3), CrossEntropyLoss, AdamW; "
        "BatchNorm running_mean/running_var in frozen_params",
        10,
        bn_mlp,
        [InputSpec("input", "x", (12,))],
        "ce",
        "classes:3",
        frozen=_bn_stats,
        track_frozen_each_step=True,
    ),
    FixtureSpec(
        "custom_loss",
        "Linear(8,16)-Tanh-Linear(16,1), custom onnxblock loss 0.7*MSELoss + 0.3*L1Loss "
        "(Constant/Mul/Add blocks), AdamW",
        11,
        regressor,
        [InputSpec("input", "x", (8,))],
        "custom",
        "regress:1",
    ),
    FixtureSpec(
        "mlp_optimizers",
        "Linear(20,32)-ReLU-Linear(32,5), CrossEntropyLoss; default AdamW artifacts "
        "plus several onnxblock-built optimizer models in optimizers/",
        12,
        mlp,
        _X,
        "ce",
        "classes:5",
        optimizer_variants=True,
        notes=[
            "InplaceClipGradNorm (CPU) adds the per-tensor squared norms in the iteration order of "
            "ORT's parameter hash map (absl, salted with memory addresses), so the *_clip trajectories "
            "differ by ~1 ulp between processes (seen in 5 of 20 plain runs). The variants are "
            "therefore run by tools/fixture_optim_runner.py with ASLR off (setarch -R), "
            "PYTHONHASHSEED=0, a fixed minimal environment and fixed file names, which made reruns "
            "bit-identical here; another machine may land on a different summation order. Compare the "
            "clip variants with a tolerance (~1e-6 relative); the other variants reproduce bitwise "
            "under ORT."
        ],
    ),
]

BY_NAME = {f.name: f for f in FIXTURES}
