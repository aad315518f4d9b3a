"""Run the command line in this process and count what it compiled.

    python -m tests.helpers.count_compilations OUT.json train ARTIFACTS ... --compile

Writes the exit status, the graphs Dynamo traced (``counters["stats"]["unique_graphs"]``: zero when
every step loaded from the compile cache) and the C++ libraries inductor built to OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from torch._dynamo.utils import counters

from ort_torch_train.cli.main import main as cli_main
from tests.helpers.precompile_worker import count_library_builds


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    library_builds = count_library_builds()
    code = cli_main(argv)
    counts = {"exit": code, "traced_graphs": counters["stats"]["unique_graphs"], "library_builds": len(library_builds)}
    out.write_text(json.dumps(counts))
    sys.exit(code)


if __name__ == "__main__":
    main()
