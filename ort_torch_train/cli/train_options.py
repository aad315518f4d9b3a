"""``train``'s options, in groups (data, length, learning rate, engine, evaluation, checkpoints, output).

Each group is one function: a new option goes into its group's function (or a new group's).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ort_torch_train.cli.errors import CliError
from ort_torch_train.cli.train_help import DATA_HELP, DESCRIPTION, EXAMPLES

ArgType = Callable[[str], object]


def recompute_setting(text: str) -> int | bool:
    """argparse type of --recompute: "auto" (about sqrt(op count) segments) or a segment count >= 2."""
    if text == "auto":
        return True
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a segment count, got {text!r}") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected a segment count >= 2, got {text!r}")
    return value


def compile_setting(text: str) -> bool | str:
    """argparse type of --compile's value: "aot" (programs compiled ahead of time into the compile cache), or
    "true" / "false" (a config file's boolean)."""
    choices: dict[str, bool | str] = {"aot": "aot", "true": True, "false": False}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"expected no value (torch.compile) or 'aot', got {text!r}")
    return choices[text.lower()]


def add_data_options(parser: argparse.ArgumentParser, positive_int: ArgType, non_negative_int: ArgType) -> None:
    """--data, --inputs, --batched, --batch-size, --workers, --seed, --no-shuffle."""
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=True, metavar="DATA", help="training data file (see data layout)")
    group.add_argument("--inputs", metavar="KEY1,KEY2", help="arrays/columns for the model's inputs (see data layout)")
    group.add_argument("--batched", action="store_true", help="the training arrays are [steps, batch, ...]")
    group.add_argument(
        "--batch-size", type=positive_int, metavar="N", help="rows per micro-batch (default 32; ignored with --batched)"
    )
    group.add_argument(
        "--workers", type=non_negative_int, default=0, metavar="N", help="DataLoader worker processes (default 0)"
    )
    group.add_argument(
        "--seed",
        type=seed_value,
        default=None,
        metavar="N",
        help="seed of the shuffling and of dropout (default 0, or the resumed checkpoint's)",
    )
    group.add_argument("--no-shuffle", action="store_true", help="keep the data's order")


def seed_value(text: str) -> int:
    """argparse type of --seed: an integer in 0 .. 2**63 - 1 (torch's seed range)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2**63 - 1, got {text!r}")
    return value


def add_length_options(parser: argparse.ArgumentParser, positive_int: ArgType) -> None:
    """--max-steps | --steps | --epochs, --grad-accum and --grad-accum-mode."""
    group = parser.add_argument_group("length (one of --max-steps, --steps, --epochs)")
    length = group.add_mutually_exclusive_group(required=True)
    length.add_argument(
        "--max-steps", type=positive_int, metavar="N", help="train until the optimizer's step count is N (resume-safe)"
    )
    length.add_argument("--steps", type=positive_int, metavar="N", help="train N more optimizer steps")
    length.add_argument("--epochs", type=positive_int, metavar="N", help="make N more passes over the training data")
    group.add_argument(
        "--grad-accum",
        type=positive_int,
        default=1,
        metavar="N",
        help="micro-batches per optimizer step: N module calls add up their gradients (default 1)",
    )
    group.add_argument(
        "--grad-accum-mode",
        choices=("sum", "mean"),
        default="sum",
        help="sum the micro-batches' gradients (default: ORT's semantics) or average them (HF's, Lightning's)",
    )


def add_schedule_options(
    parser: argparse.ArgumentParser, positive_int: ArgType, non_negative_int: ArgType, learning_rate: ArgType
) -> None:
    """--lr, --schedule, --warmup, --total-steps."""
    group = parser.add_argument_group("learning rate")
    group.add_argument(
        "--lr", type=learning_rate, metavar="LR", help="peak learning rate (default: the checkpoint's initial one)"
    )
    group.add_argument(
        "--schedule",
        choices=("constant", "linear", "cosine"),
        default="constant",
        help="learning-rate schedule after warmup (default constant)",
    )
    group.add_argument(
        "--warmup", type=non_negative_int, default=0, metavar="N", help="linear warmup steps (default 0)"
    )
    group.add_argument("--total-steps", type=positive_int, metavar="N", help="step at which linear/cosine reach 0")


def thread_count(text: str) -> int | str:
    """argparse type of --threads: "auto", "torch" or a positive integer (``parse_threads``)."""
    from ort_torch_train.training.threads import parse_threads  # torch: imported once --threads is given

    try:
        return parse_threads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("threads: ")) from None


def run_threads(threads: int | str | None, deterministic: bool) -> tuple[int | str, str]:
    """The thread setting of a run and what chose it, from --threads (None when not given) and
    --deterministic: --threads, else ``default_threads``; --deterministic turns "torch" into torch's
    count, and refuses auto."""
    import torch  # run time only: parsing stays free of torch

    from ort_torch_train.training.threads import default_source, default_threads

    if threads is not None:
        setting, source = threads, f"--threads {threads}"
    else:
        setting, source = default_threads(), default_source()
    if not deterministic:
        return setting, source
    if threads == "auto":
        raise CliError("--deterministic fixes the thread count: --threads auto follows the load; give --threads N")
    if isinstance(setting, int):
        return setting, f"--deterministic, {source}"
    return torch.get_num_threads(), "--deterministic: torch's count"


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """--device, --threads, --deterministic, --compile, --mixed-precision, --recompute, --shard-state,
    --compile-cache, --lora."""
    group = parser.add_argument_group("engine")
    group.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: cuda when available)")
    group.add_argument(
        "--threads",
        type=thread_count,
        metavar="N|auto|torch",
        help="CPU threads per step: N, auto (the cores other processes leave free; results may then differ "
        "in the last bits between runs under different loads) or torch (torch's count, untouched). "
        "Default: $ORT_TORCH_TRAIN_THREADS, else torch when $OMP_NUM_THREADS is set, else auto",
    )
    group.add_argument(
        "--deterministic",
        action="store_true",
        help="a fixed CPU thread count (--threads N, else the count that variable fixes, else torch's), so that "
        "two runs of one command on one machine repeat bit for bit whatever the load",
    )
    group.add_argument(
        "--compile",
        nargs="?",
        const=True,
        default=False,
        type=compile_setting,
        metavar="aot",
        help="run each step (forward, backward, update) as one torch.compile'd graph "
        "(compiling takes seconds first; faster steps after); --compile aot: the train, optimizer and eval "
        "steps as programs compiled ahead of time into the compile cache (CPU, float32; a later run loads them)",
    )
    group.add_argument(
        "--mixed-precision",
        choices=("bf16", "fp16"),
        help="autocast the forward to bf16 or fp16 with float32 master weights (fp16: dynamic loss scaling)",
    )
    group.add_argument(
        "--recompute",
        type=recompute_setting,
        metavar="auto|K",
        help="recompute activations in backward: K segments, or auto (about sqrt(op count))",
    )
    group.add_argument(
        "--shard-state",
        action="store_true",
        help="under torchrun: each rank keeps 1/N of the optimizer state (ZeRO stage 1)",
    )
    group.add_argument(
        "--sharding",
        choices=("zero2", "zero3"),
        help="under torchrun: FSDP2 sharding of the gradients and optimizer state (zero2), and of the "
        "parameters too, gathered per layer (zero3); with --recompute auto (eager), per layer; with "
        "--compile, each layer compiled on its own",
    )
    group.add_argument(
        "--pipeline-stages",
        type=int,
        metavar="N",
        help="under torchrun with N ranks, eager float32 steps: cut the training graph into N stages, one per "
        "rank, each rank reading the whole batch (docs/scaling.md, Pipeline parallel)",
    )
    group.add_argument(
        "--micro-batches", type=int, default=1, metavar="M", help="with --pipeline-stages: micro-batches per batch"
    )
    group.add_argument("--pipeline-schedule", choices=("gpipe", "1f1b"), default="gpipe", help="with --pipeline-stages")
    group.add_argument(
        "--pipeline-cuts",
        default="",
        metavar="CUTS",
        help="with --pipeline-stages: the tensor names to cut at, in ORT's pipeline_cut_info_string format "
        "(default: balanced by parameter count)",
    )
    group.add_argument(
        "--adasum",
        action="store_true",
        help="under torchrun, eager steps, 2/4/8... ranks: combine the gradients by Adasum instead of averaging",
    )
    cache = group.add_mutually_exclusive_group()
    cache.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="with --compile: save compiled steps in DIR and load them from it (default: "
        "$ORT_TORCH_TRAIN_CACHE_DIR, else $XDG_CACHE_HOME/ort_torch_train or ~/.cache/ort_torch_train)",
    )
    cache.add_argument(
        "--no-compile-cache", action="store_true", help="with --compile: compile every step anew, save nothing"
    )
    group.add_argument(
        "--lora",
        metavar="r=8,alpha=16,targets=...",
        help="train LoRA adapters only (keys r, alpha, dropout, targets (fnmatch patterns or all-linear), "
        "frozen_dtype, seed; docs/lora.md); a LoRA checkpoint given to --resume keeps its config",
    )


def add_evaluation_options(parser: argparse.ArgumentParser, positive_int: ArgType) -> None:
    """--eval-data, --eval-inputs, --eval-every, --metric."""
    group = parser.add_argument_group("evaluation")
    group.add_argument("--eval-data", metavar="EVAL", help="evaluate on this file (same formats as --data)")
    group.add_argument("--eval-inputs", metavar="KEY1,KEY2", help="arrays/columns for the eval model's inputs")
    group.add_argument(
        "--eval-every", type=positive_int, metavar="N", help="evaluate every N steps (default: before and after)"
    )
    group.add_argument(
        "--metric",
        default="loss",
        metavar="NAME",
        help="loss (default), accuracy, perplexity, f1, precision, recall, auroc, mae, rmse, r2, or "
        "package.module:function (of outputs, batch) or :Class (a torchmetrics metric); "
        "the eval loss is always reported",
    )


def add_checkpoint_options(parser: argparse.ArgumentParser, positive_int: ArgType) -> None:
    """--resume, --output, --save-every, --keep-last, --save-best, --early-stop."""
    group = parser.add_argument_group("checkpoints")
    group.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue from this checkpoint (parameters, optimizer state, step count, data position) "
        "instead of ARTIFACTS_DIR/checkpoint",
    )
    group.add_argument(
        "--output",
        default="trained_checkpoint",
        metavar="CHECKPOINT",
        help="where to save the checkpoint (default ./trained_checkpoint; replaced atomically)",
    )
    group.add_argument(
        "--save-every", type=positive_int, metavar="N", help="also save --output every N steps (Ctrl-C always saves)"
    )
    group.add_argument(
        "--keep-last",
        type=positive_int,
        metavar="N",
        help="with --save-every: also keep numbered checkpoints OUTPUT.step-<step>, the N newest",
    )
    group.add_argument(
        "--save-best",
        metavar="METRIC",
        help="save OUTPUT.best whenever the eval METRIC (loss or --metric's) is the best so far",
    )
    group.add_argument(
        "--early-stop",
        type=positive_int,
        metavar="PATIENCE",
        help="stop after PATIENCE evaluations without the --save-best metric (else --metric) improving; a run "
        "resumed from an early stop trains on when asked for more (a larger --max-steps, --steps, --epochs)",
    )


def add_output_options(parser: argparse.ArgumentParser, positive_int: ArgType) -> None:
    """--metrics, --metrics-every, --tensorboard, --mlflow, --json, --summary, --quiet."""
    group = parser.add_argument_group("output")
    group.add_argument(
        "--metrics",
        metavar="FILE.jsonl",
        help="append one JSON line per --metrics-every steps (step, loss, lr, steps_per_s) and per evaluation",
    )
    group.add_argument(
        "--metrics-every",
        type=positive_int,
        default=1,
        metavar="N",
        help="steps between metrics lines and logged values (default 1; the last step is always written)",
    )
    group.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write TensorBoard scalars to DIR (tensorboard: python -m ort_torch_train.install --extra tensorboard)",
    )
    group.add_argument(
        "--mlflow",
        metavar="URI|DIR",
        help="log to MLflow: a tracking URI, or a folder used as a local file store (mlflow-skinny)",
    )
    group.add_argument("--mlflow-experiment", default="ort-torch-train", metavar="NAME", help="MLflow experiment")
    group.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout instead of text (also after Ctrl-C)"
    )
    group.add_argument(
        "--summary", metavar="FILE.json", help="also write the JSON summary to FILE.json (also after Ctrl-C)"
    )
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no text summary")


def add_train_parser(
    commands: argparse._SubParsersAction,
    formatter: type[argparse.HelpFormatter],
    positive_int: ArgType,
    non_negative_int: ArgType,
    learning_rate: ArgType,
    run: Callable[[argparse.Namespace], None],
) -> argparse.ArgumentParser:
    """Register ``train`` and its options; return its parser (for more options)."""
    parser = commands.add_parser(
        "train",
        help="train the artifacts on a data file and save a resumable checkpoint",
        description=DESCRIPTION,
        epilog=DATA_HELP + "\n\n" + EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS_DIR", help="folder holding the artifacts")
    add_data_options(parser, positive_int, non_negative_int)
    add_length_options(parser, positive_int)
    add_schedule_options(parser, positive_int, non_negative_int, learning_rate)
    add_engine_options(parser)
    add_evaluation_options(parser, positive_int)
    add_checkpoint_options(parser, positive_int)
    add_output_options(parser, positive_int)
    parser.set_defaults(run=run)
    return parser
