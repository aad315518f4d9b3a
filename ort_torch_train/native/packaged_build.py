"""Build libort_torch_train_packaged, the runtime that trains a package of steps with no Python: libtorch only.

``build_packaged(prefix)`` compiles the C++ sources in ``native/packaged/``, as one translation unit, with the system
C++ compiler against the installed torch's headers and libraries into ``prefix/lib/libort_torch_train_packaged.so``
and copies the C headers into ``prefix/include/``. ``packaged_flags(prefix)`` gives what a program compiles and
links with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ort_torch_train.native.build import (
    HEADERS,
    NATIVE,
    SANITIZE,
    InstalledLibrary,
    c_string,
    compile_into,
    compiler_on_path,
    install_headers,
)

SOURCES = NATIVE / "packaged"
LIBRARY = "libort_torch_train_packaged.so"


@dataclass(frozen=True)
class PackagedFlags(InstalledLibrary):
    """What a C or C++ program needs to use the packaged runtime installed under ``prefix``."""

    library_name: ClassVar[str] = LIBRARY
    torch_lib: Path

    @property
    def libs(self) -> list[str]:
        """Link flags: the runtime (which answers the core OrtApi members too), with its and libtorch's run paths."""
        lib = self.prefix / "lib"
        return [f"-L{lib}", f"-Wl,-rpath,{lib}", f"-Wl,-rpath,{self.torch_lib}", "-l:" + LIBRARY]


def find_cxx_compiler() -> str:
    """The C++ compiler: ``$CXX``, else c++, g++ or clang++ on the PATH."""
    return compiler_on_path(
        "CXX", ["c++", "g++", "clang++"], "no C++ compiler found: install g++ or clang++, or set CXX"
    )


def _torch() -> tuple[Path, str, bool]:
    """(torch's folder, its version, whether it uses the C++11 ABI), read without running a Python step."""
    import torch

    return Path(torch.__file__).resolve().parent, str(torch.__version__), bool(torch._C._GLIBCXX_USE_CXX11_ABI)


def libtorch_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) of C++ code built against the installed torch's libtorch: its C++ ABI, its
    headers, its libraries and their run path."""
    folder, _, cxx11_abi = _torch()
    include, lib = folder / "include", folder / "lib"
    compile_flags = [
        f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}",
        f"-I{include}",
        f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
    ]
    return compile_flags, [f"-L{lib}", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{lib}"]


UNITY = "ott_packaged_unity.cpp"  # written beside the output: every source, one translation unit


def unity_source() -> str:
    """The translation unit the runtime compiles from: each C++ source in ``native/packaged/`` included once, so that
    the torch headers they all include are parsed once (the names in their anonymous namespaces must differ)."""
    return "".join(f'#include "{path.name}"\n' for path in sorted(SOURCES.glob("*.cpp")))


def compile_command(output: Path, compiler: str, sanitize: bool = False) -> list[str]:
    """The compiler command that builds the runtime into ``output`` from ``UNITY`` beside it (``unity_source``);
    with ``SANITIZE``'s flags if ``sanitize``."""
    return [
        compiler,
        "-std=c++20",
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        *(SANITIZE if sanitize else []),
        f"-DOTT_TORCH_VERSION={c_string(_torch()[1])}",
        f"-I{HEADERS}",
        f"-iquote{SOURCES}",
        *libtorch_flags()[0],
        "-shared",
        str(output.with_name(UNITY)),
        "-o",
        str(output),
        "-Wl,--no-as-needed",
        *libtorch_flags()[1],
    ]


def packaged_flags(prefix: str | os.PathLike) -> PackagedFlags:
    """The flags for the runtime under ``prefix``."""
    return PackagedFlags(Path(prefix).resolve(), _torch()[0] / "lib")


def build_packaged(prefix: str | os.PathLike, compiler: str | None = None, sanitize: bool = False) -> PackagedFlags:
    """Build the runtime and install its headers under ``prefix``; return the flags to use it. ``sanitize``: built
    with AddressSanitizer and UBSan, for programs built with the same flags. NativeBuildError with the compiler's
    output where it fails."""
    target = packaged_flags(prefix)
    target.library.parent.mkdir(parents=True, exist_ok=True)
    install_headers(target, "*.h")
    chosen = compiler or find_cxx_compiler()

    def commands(output: Path) -> list[list[str]]:
        output.with_name(UNITY).write_text(unity_source())
        return [compile_command(output, chosen, sanitize)]

    compile_into(target.library, commands)
    return target
