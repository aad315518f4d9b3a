"""The architecture rules of the packages, read from their source: imports form no cycle between modules nor
between packages, every package imports only from the layers below its own, the command line is one package,
public functions are annotated and no module is too long."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.paths import ROOT

PACKAGE = ROOT / "ort_torch_train"
# module name prefix -> source folder (the adapters are installed as ort_torch_train.adapters)
SOURCES = {"ort_torch_train": PACKAGE, "ort_torch_train.adapters": ROOT / "adapters"}
MAX_MODULE_LINES = 450

# The layering, from the bottom up: a first-level package (or top-level module) of ort_torch_train imports only
# from the layers below its own. The package's own __init__ (``ort_torch_train``) stands outside: every import
# runs it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("elem_types",),
    (
        "dtypes",
        "fileio",
        "install",
        "logs",
        "module_meta",
        "onnx2torch_import",
        "progress",
        "scratch",
        "torch_internals",
    ),
    ("graph",),
    ("checkpoint",),
    ("adapters",),
    ("convert",),
    ("passes",),
    ("state",),
    ("export",),
    ("lora",),
    ("optim",),
    ("distributed",),
    ("training",),
    ("api", "artifacts"),
    ("legacy", "session"),
    ("native",),
    ("trainer",),
    ("cli",),
    ("__main__",),
)


def modules() -> dict[str, Path]:
    """Every module of ort_torch_train and of the adapters, by its dotted name."""
    found = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """The ids of every node under an ``if TYPE_CHECKING:`` block."""
    return {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in ast.walk(node)
    }


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from {'.' * level}{name} import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere (functions included, ``TYPE_CHECKING`` blocks not)."""
    found = modules()
    graph: dict[str, set[str]] = {module: set() for module in found}
    for module, path in found.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path.name == "__init__.py", node.level, node.module)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            graph[module].update(target for target in targets if target in found and target != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return found


def package_of(module: str) -> str | None:
    """The first-level package (or top-level module) of ort_torch_train holding ``module``; None for the
    package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import (``package_of``), from a module graph."""
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        source = package_of(module)
        if source is None:
            continue
        targets = {package_of(target) for target in imported}
        packages.setdefault(source, set()).update(t for t in targets if t is not None and t != source)
    return packages


def layering_violations(packages: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """The imports of ``packages`` that do not go to a lower layer, and the packages no layer names."""
    layer_of = {package: index for index, layer in enumerate(layers) for package in layer}
    found = [f"{package} is in no layer" for package in sorted(packages) if package not in layer_of]
    for package, imported in sorted(packages.items()):
        for target in sorted(imported):
            if package in layer_of and target in layer_of and layer_of[target] >= layer_of[package]:
                found.append(f"{package} (layer {layer_of[package]}) imports {target} (layer {layer_of[target]})")
    return found


def _public_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """(qualified name, definition, is a method) of the module's public functions and public classes' methods."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions) and not node.name.startswith("_"):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, functions) and not member.name.startswith("_"):
                    yield f"{node.name}.{member.name}", member, True


def _unannotated(function: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    """The parameters (and ``return``) of ``function`` that have no annotation."""
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    if is_method and not static and positional:
        positional = positional[1:]  # self / cls
    parameters = positional + arguments.kwonlyargs + [a for a in (arguments.vararg, arguments.kwarg) if a]
    missing = [parameter.arg for parameter in parameters if parameter.annotation is None]
    return missing + (["return"] if function.returns is None else [])


def test_imports_form_no_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_packages_form_no_cycle() -> None:
    found = cycles(package_graph(import_graph()))
    assert not found, "package import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_packages_import_only_from_lower_layers() -> None:
    found = layering_violations(package_graph(import_graph()), LAYERS)
    assert not found, "imports against the layering:\n" + "\n".join(found)


def test_the_checks_find_a_planted_package_cycle_and_an_upward_import() -> None:
    modules = import_graph()
    planted = {module: set(imported) for module, imported in modules.items()}
    planted["ort_torch_train.optim.engine"].add("ort_torch_train.training.engine")
    packages = package_graph(planted)
    assert any({"optim", "training"} <= set(component) for component in cycles(packages))
    assert "optim (layer 11) imports training (layer 13)" in layering_violations(packages, LAYERS)


def test_the_command_line_is_one_package() -> None:
    assert sorted(path.name for path in PACKAGE.glob("cli_*.py")) == []
    assert (PACKAGE / "cli" / "__init__.py").is_file()


def test_public_functions_and_methods_are_fully_annotated() -> None:
    missing = []
    for module, path in modules().items():
        if not path.is_relative_to(PACKAGE) or any(part.startswith("_") for part in module.split(".")):
            continue
        for name, function, is_method in _public_functions(ast.parse(path.read_text(), str(path))):
            if unannotated := _unannotated(function, is_method):
                missing.append(f"{module}.{name}: {', '.join(unannotated)}")
    assert not missing, f"{len(missing)} public functions lack annotations:\n" + "\n".join(missing)


def test_no_module_is_over_the_line_limit() -> None:
    lengths = {module: len(path.read_text().splitlines()) for module, path in modules().items()}
    too_long = {module: lines for module, lines in lengths.items() if lines > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"
