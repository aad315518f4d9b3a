"""Building libort_torch_train and the C/C++ test programs once per test session, and running them.

``native_build`` skips (cleanly) where no C compiler, no shared libpython or no onnxruntime package is present.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ort_torch_train.native import Flags, NativeBuildError, build
from ort_torch_train.native.build import find_compiler
from ort_torch_train.training.threads import THREADS_VARIABLE
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled

PROGRAMS = ROOT / "tests" / "native"
MLP = ROOT / "tests" / "fixtures" / "mlp_ce_adamw_sched" / "artifacts"


@dataclass
class NativeBuild:
    """The library built under ``flags.prefix``, and the programs compiled against it (by name)."""

    flags: Flags
    compiler: str
    programs: dict[str, Path] = field(default_factory=dict)

    def program(self, source: Path, transparent: bool = False) -> Path:
        """Compile a C or C++ program (once): linked with the library, or only with ONNX Runtime (``transparent``)."""
        key = f"{source}:{transparent}"
        if key not in self.programs:
            cxx = source.suffix == ".cpp"
            compiler = (shutil.which("c++") or shutil.which("g++")) if cxx else self.compiler
            if compiler is None:
                pytest.skip("no C++ compiler")
            output = self.flags.prefix / "bin" / (source.stem + ("_transparent" if transparent else ""))
            output.parent.mkdir(exist_ok=True)
            standard = "-std=c++17" if cxx else "-std=c11"
            libs = self.flags.ort_libs if transparent else self.flags.libs
            command = [compiler, standard, "-O1", "-Wall", f"-I{PROGRAMS}", *self.flags.cflags, str(source)]
            command += ["-o", str(output), *libs, "-lpthread", "-lm"]
            done = subprocess.run(command, capture_output=True, text=True)
            assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr}"
            self.programs[key] = output
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
    """The library, built once per test process, or a skip where this machine cannot build it."""
    prefix = tmp_path_factory.getbasetemp() / "native"
    if prefix not in _BUILT:
        try:
            _BUILT[prefix] = NativeBuild(build(prefix), find_compiler())
        except NativeBuildError as error:
            pytest.skip(f"native library not buildable here: {error}")
    return _BUILT[prefix]
