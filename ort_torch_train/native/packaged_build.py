"""Build libort_torch_train_packaged, the runtime that trains a package of steps with no Python: libtorch only.

``build_packaged(prefix)`` compiles the C++ sources in ``native/packaged/`` with the system C++ compiler against the
installed torch's headers and libraries into ``prefix/lib/libort_torch_train_packaged.so`` and copies the C
headers into ``prefix/include/``. ``packaged_flags(prefix)`` gives what a program compiles and links with.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ort_torch_train.native.build import HEADERS, NATIVE, NativeBuildError

SOURCES = NATIVE / "packaged"
LIBRARY = "libort_torch_train_packaged.so"


@dataclass(frozen=True)
class PackagedFlags:
    """What a C or C++ program needs to use the packaged runtime installed under ``prefix``."""

    prefix: Path
    torch_lib: Path

    @property
    def library(self) -> Path:
        """The built library."""
        return self.prefix / "lib" / LIBRARY

    @property
    def cflags(self) -> list[str]:
        """Compile flags: the include folder."""
        return [f"-I{self.prefix / 'include'}"]

    @property
    def libs(self) -> list[str]:
        """Link flags: the runtime (which answers the core OrtApi members too), with its and libtorch's run paths."""
        lib = self.prefix / "lib"
        return [f"-L{lib}", f"-Wl,-rpath,{lib}", f"-Wl,-rpath,{self.torch_lib}", "-l:" + LIBRARY]


def find_cxx_compiler() -> str:
    """The C++ compiler: ``$CXX``, else c++, g++ or clang++ on the PATH."""
    for name in ([os.environ["CXX"]] if os.environ.get("CXX") else []) + ["c++", "g++", "clang++"]:
        found = shutil.which(shlex.split(name)[0]) if name else None
        if found:
            return found
    raise NativeBuildError("no C++ compiler found: install g++ or clang++, or set CXX")


def _torch() -> tuple[Path, str, bool]:
    """(torch's folder, its version, whether it uses the C++11 ABI), read without running a Python step."""
    import torch

    return Path(torch.__file__).resolve().parent, str(torch.__version__), bool(torch._C._GLIBCXX_USE_CXX11_ABI)


# the torch headers every source includes first (through ott_packaged.h): parsed once per build, not once per source
PRELUDE = "#include <ATen/ATen.h>\n"


def _source_flags() -> list[str]:
    """The flags every translation unit compiles with (the sources and their precompiled prelude alike)."""
    folder, version, cxx11_abi = _torch()
    return [
        "-std=c++20",
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}",
        f"-DOTT_TORCH_VERSION={_c_string(version)}",
        f"-I{HEADERS}",
        f"-I{folder / 'include'}",
        f"-I{folder / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
    ]


def precompile_command(prelude: Path, compiler: str) -> list[str]:
    """The compiler command that precompiles the header ``prelude`` (beside it, as ``prelude.gch``)."""
    return [compiler, *_source_flags(), "-x", "c++-header", str(prelude), "-o", f"{prelude}.gch"]


def compile_command(output: Path, compiler: str, prelude: Path | None = None) -> list[str]:
    """The compiler command that builds the runtime into ``output``, each source after ``prelude`` (whose
    precompiled form the compiler uses where it is beside it) when one is given."""
    folder = _torch()[0]
    included = ["-Winvalid-pch", "-include", str(prelude)] if prelude is not None else []
    return [
        compiler,
        *_source_flags(),
        "-shared",
        *included,
        *[str(path) for path in sorted(SOURCES.glob("*.cpp"))],
        "-o",
        str(output),
        f"-L{folder / 'lib'}",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        f"-Wl,-rpath,{folder / 'lib'}",
    ]


def packaged_flags(prefix: str | os.PathLike) -> PackagedFlags:
    """The flags for the runtime under ``prefix``."""
    return PackagedFlags(Path(prefix).resolve(), _torch()[0] / "lib")


def build_packaged(prefix: str | os.PathLike, compiler: str | None = None) -> PackagedFlags:
    """Build the runtime and install its headers under ``prefix``; return the flags to use it.
    NativeBuildError with the compiler's output where it fails."""
    target = packaged_flags(prefix)
    lib, include = target.prefix / "lib", target.prefix / "include"
    lib.mkdir(parents=True, exist_ok=True)
    include.mkdir(parents=True, exist_ok=True)
    for header in sorted(HEADERS.glob("*.h")):
        shutil.copyfile(header, include / header.name)
    with tempfile.TemporaryDirectory(dir=lib) as scratch:
        output, prelude = Path(scratch) / LIBRARY, Path(scratch) / "ott_prelude.h"
        prelude.write_text(PRELUDE)
        compiler = compiler or find_cxx_compiler()
        for command in (precompile_command(prelude, compiler), compile_command(output, compiler, prelude)):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise NativeBuildError(f"compiling {LIBRARY} failed:\n{shlex.join(command)}\n{done.stderr.strip()}")
        os.replace(output, target.library)
    return target


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
