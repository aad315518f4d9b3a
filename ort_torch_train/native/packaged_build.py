"""Build libort_torch_train_packaged, the runtime that trains a package of steps with no Python: libtorch only.

``build_packaged(prefix)`` compiles the C++ sources in ``native/packaged/`` with the system C++ compiler against the
installed torch's headers and libraries into ``prefix/lib/libort_torch_train_packaged.so`` and copies the C
headers into ``prefix/include/``. ``packaged_flags(prefix)`` gives what a program compiles and links with.
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


# the torch headers every source includes first (through ott_packaged.h): parsed once per build, not once per source
PRELUDE = "#include <ATen/ATen.h>\n"


def _source_flags(sanitize: bool) -> list[str]:
    """The flags every translation unit compiles with (the sources and their precompiled prelude alike; with
    ``SANITIZE``'s flags if ``sanitize``)."""
    version = _torch()[1]
    return [
        "-std=c++20",
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        *(SANITIZE if sanitize else []),
        f"-DOTT_TORCH_VERSION={c_string(version)}",
        f"-I{HEADERS}",
        *libtorch_flags()[0],
    ]


def precompile_command(prelude: Path, compiler: str, sanitize: bool = False) -> list[str]:
    """The compiler command that precompiles the header ``prelude`` (beside it, as ``prelude.gch``)."""
    return [compiler, *_source_flags(sanitize), "-x", "c++-header", str(prelude), "-o", f"{prelude}.gch"]


def compile_command(output: Path, compiler: str, prelude: Path | None = None, sanitize: bool = False) -> list[str]:
    """The compiler command that builds the runtime into ``output``, each source after ``prelude`` (whose
    precompiled form the compiler uses where it is beside it) when one is given."""
    included = ["-Winvalid-pch", "-include", str(prelude)] if prelude is not None else []
    return [
        compiler,
        *_source_flags(sanitize),
        "-shared",
        *included,
        *[str(path) for path in sorted(SOURCES.glob("*.cpp"))],
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
        prelude = output.parent / "ott_prelude.h"
        prelude.write_text(PRELUDE)
        return [precompile_command(prelude, chosen, sanitize), compile_command(output, chosen, prelude, sanitize)]

    compile_into(target.library, commands)
    return target
