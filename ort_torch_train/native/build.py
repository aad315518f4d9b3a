"""Build libort_torch_train from the sources shipped in this package, with the system C compiler.

``build(prefix)`` writes ``prefix/lib/libort_torch_train.so`` (beside links to the installed ``onnxruntime``
package's ``libonnxruntime``) and ``prefix/include/`` (the C and C++ headers). It reads Python's headers and
``libpython`` from ``sysconfig`` and needs no network. ``flags(prefix)`` gives what a program compiles and
links with, as ``python3-config`` does for Python.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

NATIVE = Path(__file__).resolve().parent
SOURCES = NATIVE / "src"
HEADERS = NATIVE / "include"
LIBRARY = "libort_torch_train.so"
ORT_SONAME = "libonnxruntime.so.1"
# compile flags of a sanitized build (for the checks of bench/experiments/sanitized_native.py, never shipped): the
# programs that load such a library are compiled with them too, so that the sanitizers' runtime loads first
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]


class NativeBuildError(RuntimeError):
    """The library cannot be built here: no compiler, no Python headers or libpython, no onnxruntime."""


@dataclass(frozen=True)
class InstalledLibrary:
    """A library built under ``prefix``: ``prefix/lib/<library_name>``, its headers in ``prefix/include``."""

    library_name: ClassVar[str]
    prefix: Path

    @property
    def library(self) -> Path:
        """The built library."""
        return self.prefix / "lib" / self.library_name

    @property
    def cflags(self) -> list[str]:
        """Compile flags: the include folder."""
        return [f"-I{self.prefix / 'include'}"]


@dataclass(frozen=True)
class Flags(InstalledLibrary):
    """What a C or C++ program needs to use the library installed under ``prefix``."""

    library_name: ClassVar[str] = LIBRARY

    @property
    def libs(self) -> list[str]:
        """Link flags for the explicit way in (the library, then ONNX Runtime), with their run path."""
        lib = self.prefix / "lib"
        return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-lort_torch_train", "-l:" + ORT_SONAME]

    @property
    def ort_libs(self) -> list[str]:
        """Link flags for an unmodified ONNX Runtime program (the transparent way in: preload the library)."""
        lib = self.prefix / "lib"
        return [f"-L{lib}", f"-Wl,-rpath,{lib}", "-l:" + ORT_SONAME]


def flags(prefix: str | os.PathLike) -> Flags:
    """The flags for the library under ``prefix``."""
    return Flags(Path(prefix).resolve())


def compiler_on_path(variable: str, names: Sequence[str], missing: str) -> str:
    """The compiler named by ``$variable``, else the first of ``names`` on the PATH; NativeBuildError(``missing``)
    where there is none."""
    for name in ([os.environ[variable]] if os.environ.get(variable) else []) + list(names):
        found = shutil.which(shlex.split(name)[0]) if name else None
        if found:
            return found
    raise NativeBuildError(missing)


def find_compiler() -> str:
    """The C compiler: ``$CC``, else cc, gcc or clang on the PATH."""
    return compiler_on_path("CC", ["cc", "gcc", "clang"], "no C compiler found: install gcc or clang, or set CC")


def onnxruntime_library() -> Path:
    """The installed onnxruntime package's libonnxruntime (found without importing onnxruntime)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise NativeBuildError("the onnxruntime package is not installed: pip install onnxruntime")
    capi = Path(next(iter(spec.submodule_search_locations))) / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"), key=lambda path: len(path.name), reverse=True)
    if not found:
        raise NativeBuildError(f"no libonnxruntime.so* in {capi}")
    return found[0].resolve()


def python_library() -> tuple[Path, str, str]:
    """(libpython's folder, its -l name, its soname), from sysconfig."""
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_python_version()
    if not libdir or not (Path(libdir) / soname).exists():
        raise NativeBuildError(
            f"no shared libpython ({soname or 'libpython' + version + '.so'} in {libdir}): "
            "embedding needs a Python built with --enable-shared"
        )
    return Path(libdir), f"python{version}", soname


def compile_command(prefix: Path, compiler: str, output: Path, sanitize: bool = False) -> list[str]:
    """The compiler command that builds the library into ``output`` (with ``SANITIZE``'s flags if ``sanitize``)."""
    libdir, pylib, soname = python_library()
    lib = prefix / "lib"
    return [
        compiler,
        "-std=c11",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wall",
        *(SANITIZE if sanitize else []),
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{HEADERS}",
        f"-DOTT_PYTHON_EXECUTABLE={c_string(sys.executable)}",
        f"-DOTT_LIBPYTHON={c_string(soname)}",
        *[str(path) for path in sorted(SOURCES.glob("*.c"))],
        "-o",
        str(output),
        f"-L{libdir}",
        f"-l{pylib}",
        f"-Wl,-rpath,{libdir}",
        f"-L{lib}",
        "-Wl,--no-as-needed",
        "-l:" + ORT_SONAME,
        "-Wl,-rpath,$ORIGIN",
        "-ldl",
        "-lpthread",
    ]


def build(prefix: str | os.PathLike, compiler: str | None = None, sanitize: bool = False) -> Flags:
    """Build the library and install its headers under ``prefix``; return the flags to use it. ``sanitize``: built
    with AddressSanitizer and UBSan (``SANITIZE``), for programs built with the same flags."""
    target = flags(prefix)
    lib = target.prefix / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    ort = onnxruntime_library()
    for name in (ORT_SONAME, "libonnxruntime.so"):
        _link(lib / name, ort)
    providers = ort.parent / "libonnxruntime_providers_shared.so"  # ORT looks for it beside itself
    if providers.exists():
        _link(lib / providers.name, providers.resolve())
    install_headers(target, "*.h*")
    chosen = compiler or find_compiler()
    compile_into(target.library, lambda output: [compile_command(target.prefix, chosen, output, sanitize)])
    return target


def install_headers(target: InstalledLibrary, pattern: str) -> None:
    """Copy the package's headers matching ``pattern`` into ``target``'s include folder (each atomically)."""
    include = target.prefix / "include"
    include.mkdir(parents=True, exist_ok=True)
    for header in sorted(HEADERS.glob(pattern)):
        _copy(header, include / header.name)


def compile_into(library: Path, commands: Callable[[Path], list[list[str]]]) -> None:
    """Run ``commands(output)`` in turn for an output in a scratch folder beside ``library`` (each command may write
    other files beside the output), then move the result to ``library`` (atomically); NativeBuildError with the
    failing command and the compiler's output where one fails."""
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        output = Path(scratch) / library.name
        for line in commands(output):
            done = subprocess.run(line, capture_output=True, text=True)
            if done.returncode != 0:
                raise NativeBuildError(f"compiling {library.name} failed:\n{shlex.join(line)}\n{done.stderr.strip()}")
        os.replace(output, library)


def c_string(text: str) -> str:
    """``text`` as a C string literal (for a -D definition)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() and path.resolve() == target:
        return
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, path)


def _copy(source: Path, destination: Path) -> None:
    temporary = destination.with_name(destination.name + ".tmp")
    temporary.unlink(missing_ok=True)  # a link there is replaced, not written through
    shutil.copyfile(source, temporary)
    os.replace(temporary, destination)
