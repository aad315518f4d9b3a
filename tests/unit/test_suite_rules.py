"""The suite's own rules, read from its source: every deadline goes through the one load factor
(``tests/helpers/timeouts.py``), and no unit test compares computed tensors under the load-following
thread policy ("auto"), whose thread count, and with it the last bits of a reduction, follows the load."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.timeouts import DEFAULT_SCALE, TIMEOUT_SCALE_VARIABLE, scaled

TESTS = ROOT / "tests"
FACTOR = "scaled"  # tests/helpers/timeouts.py
# calls that compare two tensors or arrays
COMPARISONS = {
    "assert_close",
    "assert_allclose",
    "assert_array_equal",
    "assert_array_almost_equal",
    "assert_close_to_terms",
    "allclose",
    "array_equal",
    "equal",
}
THREAD_VARIABLES = {"THREADS_VARIABLE", "ORT_TORCH_TRAIN_THREADS"}


def sources(folder: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(folder.rglob("*.py")):
        if "fixtures" not in path.relative_to(TESTS).parts:
            yield path, ast.parse(path.read_text(), str(path))


def _numbers_outside_the_factor(node: ast.AST) -> bool:
    """Whether ``node`` holds a number literal that no ``scaled(...)`` call encloses (a ``max`` or ``min``
    only when each of its arguments does: a floor beside a scaled remainder is no deadline)."""
    if isinstance(node, ast.Call) and _name(node.func) == FACTOR:
        return False
    if isinstance(node, ast.Call) and _name(node.func) in ("max", "min"):
        return all(_numbers_outside_the_factor(argument) for argument in node.args)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    return any(_numbers_outside_the_factor(child) for child in ast.iter_child_nodes(node))


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def unscaled_deadlines(tree: ast.Module) -> list[int]:
    """Lines that set a deadline from a number not scaled by the factor: a ``timeout=`` argument, a
    ``timeout`` parameter's default, or ``deadline = ... + seconds``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "timeout" and _numbers_outside_the_factor(node.value):
            lines.append(node.value.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = [*arguments.posonlyargs, *arguments.args]
            pairs = [
                *zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults),
                *zip(arguments.kwonlyargs, arguments.kw_defaults),
            ]
            for argument, default in pairs:
                if argument.arg == "timeout" and default is not None and _numbers_outside_the_factor(default):
                    lines.append(default.lineno)
        elif isinstance(node, ast.Assign) and any(_name(target) == "deadline" for target in node.targets):
            if _numbers_outside_the_factor(node.value):
                lines.append(node.lineno)
    return sorted(lines)


def _selects_auto(node: ast.AST) -> bool:
    """Whether ``node`` chooses the "auto" policy: ``set_threads("auto")`` / ``.choose("auto")``,
    ``threads="auto"``, the thread variable set to "auto" or removed (the default is then auto), or
    ``--threads auto`` in a command."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name, args = _name(sub.func), sub.args
            constants = [arg.value for arg in args if isinstance(arg, ast.Constant)]
            if name in ("set_threads", "choose") and "auto" in constants:
                return True
            if any(keyword.arg == "threads" and _is_auto(keyword.value) for keyword in sub.keywords):
                return True
            if name in ("setenv", "delenv", "pop") and args and _mentions_thread_variable(args[0]):
                if name != "setenv" or "auto" in constants:
                    return True
        elif isinstance(sub, ast.Dict):
            if any(
                key is not None and _mentions_thread_variable(key) and _is_auto(value)
                for key, value in zip(sub.keys, sub.values)
            ):
                return True
        elif isinstance(sub, (ast.List, ast.Tuple)):
            items = [item.value if isinstance(item, ast.Constant) else None for item in sub.elts]
            if any(a == "--threads" and b == "auto" for a, b in zip(items, items[1:])):
                return True
    return False


def _is_auto(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "auto"


def _mentions_thread_variable(node: ast.AST) -> bool:
    return _name(node) in THREAD_VARIABLES or (isinstance(node, ast.Constant) and node.value in THREAD_VARIABLES)


def _compares(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Call) and _name(sub.func) in COMPARISONS for sub in ast.walk(node))


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _is_fixture(function: ast.FunctionDef) -> bool:
    return any("fixture" in ast.unparse(decorator) for decorator in function.decorator_list)


def auto_fixtures(trees: list[ast.Module]) -> set[str]:
    """The fixtures, among ``trees``, that choose auto themselves or through a fixture they take."""
    fixtures = {f.name: f for tree in trees for f in _functions(tree) if _is_fixture(f)}
    auto = {name for name, fixture in fixtures.items() if _selects_auto(fixture)}
    while True:
        more = {
            name for name, fixture in fixtures.items() if name not in auto and {a.arg for a in fixture.args.args} & auto
        }
        if not more:
            return auto
        auto |= more


def comparisons_under_auto(tree: ast.Module, shared: list[ast.Module]) -> list[str]:
    """The tests of ``tree`` that compare tensors and choose the auto policy (in their body or through a
    fixture of ``tree`` or of ``shared``, the conftests)."""
    auto = auto_fixtures([tree, *shared])
    found = []
    for function in _functions(tree):
        if not function.name.startswith("test") or not _compares(function):
            continue
        if _selects_auto(function) or {argument.arg for argument in function.args.args} & auto:
            found.append(f"{function.name} (line {function.lineno})")
    return found


def test_every_deadline_goes_through_the_one_load_factor() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}" for path, tree in sources(TESTS) for line in unscaled_deadlines(tree)]
    assert not found, f"deadlines not scaled by tests.helpers.timeouts.scaled: {found}"


def test_no_unit_test_compares_tensors_under_the_auto_policy() -> None:
    conftests = [tree for path, tree in sources(TESTS) if path.name == "conftest.py"]
    found = [
        f"{path.relative_to(ROOT)}: {test}"
        for path, tree in sources(TESTS / "unit")
        for test in comparisons_under_auto(tree, conftests)
    ]
    assert not found, f"tests comparing tensors under the auto thread policy (pin a count: set_threads(n)): {found}"


def test_the_rules_find_what_they_forbid() -> None:
    deadlines = ast.parse(
        "import subprocess, time\n"
        "def run(timeout: float = 60): ...\n"
        "subprocess.run(['x'], timeout=120)\n"
        "subprocess.run(['x'], timeout=scaled(120))\n"
        "deadline = time.monotonic() + 30\n"
        "deadline = time.monotonic() + scaled(30)\n"
        "process.wait(timeout=max(0.0, deadline - time.monotonic()))\n"
        "process.wait(timeout=max(1.0, 2.0))\n"
    )
    assert unscaled_deadlines(deadlines) == [2, 3, 5, 8]
    under_auto = ast.parse(
        "import pytest, torch\n"
        "@pytest.fixture\n"
        "def unpinned(monkeypatch):\n"
        "    monkeypatch.delenv(THREADS_VARIABLE)\n"
        "@pytest.fixture\n"
        "def through(unpinned): ...\n"
        "def test_direct():\n"
        "    set_threads('auto')\n"
        "    torch.testing.assert_close(a, b)\n"
        "def test_by_fixture(through):\n"
        "    assert torch.equal(a, b)\n"
        "def test_cli(tmp_path):\n"
        "    run(['train', '--threads', 'auto'])\n"
        "    np.testing.assert_allclose(a, b)\n"
        "def test_pinned():\n"
        "    set_threads(2)\n"
        "    torch.testing.assert_close(a, b)\n"
        "def test_auto_without_a_comparison(unpinned):\n"
        "    assert threads_setting() == 'auto'\n"
    )
    assert comparisons_under_auto(under_auto, []) == [
        "test_direct (line 7)",
        "test_by_fixture (line 10)",
        "test_cli (line 12)",
    ]


def test_the_factor_comes_from_its_variable_and_refuses_a_bad_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_SCALE_VARIABLE, raising=False)
    assert scaled(10) == 10 * DEFAULT_SCALE
    monkeypatch.setenv(TIMEOUT_SCALE_VARIABLE, "2.5")
    assert scaled(10) == 25
    for bad in ("0", "-1", "many", "inf", "nan"):
        monkeypatch.setenv(TIMEOUT_SCALE_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"^{TIMEOUT_SCALE_VARIABLE}: expected a number > 0, got {bad!r}$"):
            scaled(10)
