"""Building libort_torch_train and the C/C++ test programs once per test run, and running them.

The library and each program are built once per run and shared by every pytest-xdist worker of the run (see
``tests.helpers.shared_builds``). ``build_native`` skips (cleanly) where no C compiler, no shared libpython or no
onnxruntime package is present.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ort_torch_train.native import Flags, NativeBuildError, build, flags
from ort_torch_train.native.build import find_compiler
from ort_torch_train.training.threads import THREADS_VARIABLE
from tests.helpers.paths import ROOT
from tests.helpers.shared_builds import built_once
from tests.helpers.timeouts import scaled

PROGRAMS = ROOT / "tests" / "native"
MLP = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"


@dataclass
class NativeBuild:
    """The library built under ``flags.prefix``, and the programs compiled against it (by name), shared by the
    workers of the run through ``tmp_path_factory``'s base folder."""

    flags: Flags
    compiler: str
    tmp_path_factory: pytest.TempPathFactory
    programs: dict[str, Path] = field(default_factory=dict)

    def program(self, source: Path, transparent: bool = False) -> Path:
        """Compile a C or C++ program (once per run): linked with the library, or only with ONNX Runtime
        (``transparent``)."""
        key = f"{source}:{transparent}"
        if key not in self.programs:
            cxx = source.suffix == ".cpp"
            compiler = (shutil.which("c++") or shutil.which("g++")) if cxx else self.compiler
            if compiler is None:
                pytest.skip("no C++ compiler")
            standard = "-std=c++17" if cxx else "-std=c11"
            libs = self.flags.ort_libs if transparent else self.flags.libs

            def build(output: Path) -> None:
                command = [compiler, standard, "-O1", "-Wall", f"-I{PROGRAMS}", *self.flags.cflags, str(source)]
                command += ["-o", str(output), *libs, "-lpthread", "-lm"]
                done = subprocess.run(command, capture_output=True, text=True)
                assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr}"

            digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:12]
            name = f"{source.stem}{'_cpp' if cxx else ''}{'_transparent' if transparent else ''}-{digest}"
            self.programs[key] = built_once(self.tmp_path_factory, f"native_programs/{name}", build)
        return self.programs[key]

    def run(
        self,
        program: Path,
        *args: str,
        preload: bool = False,
        threads: int = 1,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a program (the library preloaded when asked) with the engine on ``threads`` threads, ``env`` added;
        its output."""
        env = self.environment(threads, env)
        if preload:
            env["LD_PRELOAD"] = str(self.flags.library)
        return subprocess.run(
            [str(program), *args], capture_output=True, text=True, env=env, timeout=timeout or scaled(300)
        )

    def environment(self, threads: int = 1, env: dict[str, str] | None = None) -> dict[str, str]:
        """The environment programs run in: this one, the engine on ``threads`` threads, ``env`` added."""
        return dict(os.environ, **{THREADS_VARIABLE: str(threads)}, **(env or {}))


_BUILT: dict[Path, NativeBuild] = {}


def build_native(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    """The library, built once per test run, or a skip where this machine cannot build it."""

    def build_library(prefix: Path) -> None:
        try:
            build(prefix)
        except NativeBuildError as error:
            pytest.skip(f"native library not buildable here: {error}")

    prefix = built_once(tmp_path_factory, "native", build_library)
    if prefix not in _BUILT:
        _BUILT[prefix] = NativeBuild(flags(prefix), find_compiler(), tmp_path_factory)
    return _BUILT[prefix]
