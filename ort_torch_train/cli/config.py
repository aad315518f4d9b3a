"""``train --config run.yaml`` (or .toml, .json): a file of ``train``'s options, overridden by the
flags on the command line; and ``OUTPUT.options.json``, the resolved options a run saves beside its
checkpoint, which ``--resume OUTPUT`` reads back (below the config file and the flags).

Keys are the options' names (``max_steps`` or ``max-steps``; ``artifacts`` for ARTIFACTS_DIR). A key
that names no option is an error. Each layer becomes the flags it stands for, placed before the
command line's, so argparse checks every value as it checks a flag and the last one given wins.
``inputs`` may be a mapping of input to column or list of columns.

The saved options are read back as untrusted input: a file they name for writing must lie inside their
own folder, options never saved are refused, and code they name (``metric: package.module:function``)
is imported only when the command line names it again.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

from ort_torch_train.cli.errors import CliError
from ort_torch_train.errors import PathOutsideError, SpecialFileError
from ort_torch_train.fileio import atomic_write_bytes, path_inside, read_regular_file

COMMAND = "train"
LENGTH = ("max_steps", "steps", "epochs")  # one of them: a higher layer's replaces a lower one's
CONFIG_LIMIT = 1 << 20  # bytes: a file of options is far smaller
MESSAGE_LIMIT = 300  # characters of a parser's error quoted
NOT_SAVED = ("run", "config", "resume", "verbose", "traceback", "json", "quiet")  # per invocation
WRITTEN = ("output", "metrics", "summary", "tensorboard", "mlflow", "compile_cache")  # options naming a path written


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` on the ``train`` parser (read by ``expand_config`` before parsing)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="read options from a YAML, TOML or JSON file (keys: option names, e.g. max_steps, inputs, "
        "artifacts); flags on the command line override it",
    )


def options_path(output: str | Path) -> Path:
    """Where a run saves its resolved options: ``OUTPUT.options.json``."""
    output = Path(output)
    return output.with_name(output.name + ".options.json")


def save_options(args: argparse.Namespace) -> Path:
    """Write the run's resolved options (every one set, defaults included) to ``OUTPUT.options.json``."""
    values = {dest: value for dest, value in sorted(vars(args).items()) if dest not in NOT_SAVED and value is not None}
    path = options_path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(values, indent=2) + "\n").encode())
    return path


def expand_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with the options of ``--config`` and of ``--resume``'s saved options inserted as flags
    before the command line's own (which therefore win)."""
    if COMMAND not in argv:
        return argv
    at = argv.index(COMMAND) + 1
    head, given = argv[:at], argv[at:]
    train = _subparser(parser, COMMAND)
    actions = {option: action for action in train._actions for option in action.option_strings}
    given_dests, given_positional = _dests_in(given, actions)
    layers: list[dict[str, Any]] = []  # highest first
    config = _flag_value(given, "--config")
    if config is not None:
        layers.append(load_config(config, train))
    resume = _flag_value(given, "--resume") or next(
        (str(layer["resume"]) for layer in layers if "resume" in layer), None
    )
    if resume is not None and options_path(resume).is_file():
        saved = load_config(str(options_path(resume)), train)
        named = set(given_dests).union(*layers)  # the command line's options and its config file's
        check_saved_options(saved, options_path(resume), named)
        layers.append(saved)
    tokens: list[str] = []
    positional: str | None = None
    seen = set(given_dests)
    for layer in layers:
        if any(key in seen for key in LENGTH):
            layer = {key: value for key, value in layer.items() if key not in LENGTH}
        if "artifacts" in layer and not given_positional and positional is None:
            positional = str(layer["artifacts"])
        for dest, value in layer.items():
            if dest not in seen and dest != "artifacts":
                tokens += _as_flags(dest, value, train)
                seen.add(dest)
    return head + ([positional] if positional is not None else []) + tokens + given


def check_saved_options(saved: Mapping[str, Any], path: Path, given: set[str]) -> None:
    """Refuse saved options that a run never saves, a path written outside the saved file's folder, and
    code to import that the command line does not name again (``given``: the options it sets)."""
    for dest in saved:
        if dest in NOT_SAVED:
            raise CliError(f"{str(path)!r}: {dest!r} is never saved by a run: the file was edited; remove the key")
    for dest in WRITTEN:
        value = saved.get(dest)
        if dest in given or value is None:
            continue
        if not isinstance(value, str) or (dest == "mlflow" and "://" in value):
            raise CliError(
                f"{str(path)!r}: {dest!r} is {value!r}, expected a path inside {str(path.parent)!r}; "
                f"give --{dest.replace('_', '-')} on the command line to write elsewhere"
            )
        folder = os.path.abspath(path.parent)
        try:
            path_inside(folder, os.path.relpath(os.path.abspath(value), folder), f"{str(path)!r}: {dest!r}")
        except (PathOutsideError, ValueError) as error:
            raise CliError(f"{error}; give --{dest.replace('_', '-')} on the command line to write there") from None
    metric = saved.get("metric")
    if "metric" not in given and isinstance(metric, str) and ":" in metric:
        raise CliError(
            f"{str(path)!r}: 'metric' names code to import, {metric!r}: a saved file does not import code; "
            f"give --metric {metric} on the command line to run it"
        )


def load_config(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The options of a YAML, TOML or JSON file, by destination name; unknown keys refused."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"config file not found: {path!r}")
    data = _read(file)
    if not isinstance(data, Mapping):
        raise CliError(f"{path!r}: expected a mapping of option names to values, got {type(data).__name__}")
    known = {action.dest for action in parser._actions if action.dest not in ("help", "config", "run")}
    options: dict[str, Any] = {}
    spelled: dict[str, object] = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in known:
            close = difflib.get_close_matches(dest, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CliError(f"{path!r}: {_short(key)} is not an option of `{parser.prog}`{hint}")
        if dest in spelled:
            raise CliError(f"{path!r}: {spelled[dest]!r} and {key!r} set the same option: keep one")
        spelled[dest] = key
        options[dest] = value
    return options


def _read(file: Path) -> Any:
    suffix = file.suffix.lower()
    try:
        text = read_regular_file(file, "config file", CONFIG_LIMIT).decode("utf-8")
    except (OSError, SpecialFileError, UnicodeDecodeError) as error:
        raise CliError(f"{str(file)!r} cannot be read as a config file: {_short(error)}") from None
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError as error:
                raise CliError("reading a YAML config needs PyYAML: pip install pyyaml") from error
            return yaml.load(text, Loader=_yaml_loader(yaml, file))  # noqa: S506 (a SafeLoader)
        if suffix == ".toml":
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            return tomllib.loads(text)  # refuses a key given twice
        if suffix == ".json":
            return json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(file, pairs))
    except CliError:
        raise
    except Exception as error:  # each parser has its own error type
        raise CliError(f"{str(file)!r} is not a readable {suffix[1:]} file ({_short(error)})") from error
    raise CliError(f"{str(file)!r}: unknown config format {suffix!r}; expected .yaml, .yml, .toml or .json")


def _unique_keys(file: Path, pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise CliError(f"{str(file)!r}: the key {_short(key)} is given twice: keep one")
        mapping[key] = value
    return mapping


def _yaml_loader(yaml: Any, file: Path) -> type:
    """PyYAML's SafeLoader refusing aliases (a few bytes of them expand to gigabytes) and keys given twice."""

    class ConfigLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise CliError(
                    f"{str(file)!r} line {event.start_mark.line + 1}: the YAML alias *{str(event.anchor)[:MESSAGE_LIMIT]} is not "
                    "allowed in a config file (write the value out)"
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, Hashable):
                    continue  # SafeLoader refuses it
                if key in seen:
                    raise CliError(
                        f"{str(file)!r} line {key_node.start_mark.line + 1}: the key {_short(key)} is given twice: "
                        "keep one"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return ConfigLoader


def _short(value: object) -> str:
    """``repr(value)``, or ``str`` of an error, cut to MESSAGE_LIMIT characters."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + f"... ({len(text)} characters)"


def _as_flags(dest: str, value: Any, parser: argparse.ArgumentParser) -> list[str]:
    action = next(action for action in parser._actions if action.dest == dest)
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise CliError(f"config option {dest!r}: expected true or false, got {value!r}")
        return [flag] if value else []
    if value is None:
        return []
    return [flag, _text(value)]


def _text(value: Any) -> str:
    """A config value as the flag's text: lists joined by commas, ``{input: columns}`` as input=columns."""
    if isinstance(value, Mapping):
        return ",".join(f"{key}={_text(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_text(item) for item in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    raise KeyError(name)


def _dests_in(tokens: list[str], actions: dict[str, argparse.Action]) -> tuple[set[str], bool]:
    """The destinations the command-line tokens set, and whether they hold a positional."""
    dests: set[str] = set()
    positional = False
    index = 0
    while index < len(tokens):
        token = tokens[index]
        option = token.split("=", 1)[0]
        if token.startswith("-") and option in actions:
            action = actions[option]
            dests.add(action.dest)
            index += 2 if _takes_next(action, tokens, index) else 1
            continue
        positional = positional or not token.startswith("-")
        index += 1
    return dests, positional


def _takes_next(action: argparse.Action, tokens: list[str], index: int) -> bool:
    """Whether the flag ``tokens[index]`` takes the next token as its value (an optional value: one its type
    reads)."""
    if action.nargs == 0 or "=" in tokens[index]:
        return False
    if action.nargs != "?":
        return True
    following = tokens[index + 1] if index + 1 < len(tokens) else "-"
    if following.startswith("-") or not callable(action.type):
        return False
    try:
        action.type(following)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return True


def _flag_value(tokens: list[str], flag: str) -> str | None:
    value = None
    for index, token in enumerate(tokens):
        if token == flag and index + 1 < len(tokens):
            value = tokens[index + 1]
        elif token.startswith(flag + "="):
            value = token.split("=", 1)[1]
    return value


def expand_command_config(argv: list[str], parser: argparse.ArgumentParser, command: str, positional: str) -> list[str]:
    """``argv`` with the options of ``command``'s ``--config`` file inserted as flags before the command
    line's own (which therefore win); the key ``positional`` stands for the command's positional argument."""
    named = next((index for index, token in enumerate(argv) if not token.startswith("-")), None)
    if named is None or argv[named] != command:
        return argv
    head, given = argv[: named + 1], argv[named + 1 :]
    config = _flag_value(given, "--config")
    if config is None:
        return argv
    subparser = _subparser(parser, command)
    actions = {option: action for action in subparser._actions for option in action.option_strings}
    given_dests, given_positional = _dests_in(given, actions)
    tokens: list[str] = []
    for dest, value in load_config(config, subparser).items():
        if dest == positional:
            if not given_positional:
                tokens.insert(0, str(value))
        elif dest not in given_dests:
            tokens += _as_flags(dest, value, subparser)
    return head + tokens + given
