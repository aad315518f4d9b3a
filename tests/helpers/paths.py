"""Where the repository, the test fixtures and the shared reference corpus live."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
REFCORPUS = ROOT.parent / "shared" / "refcorpus"
EXAMPLES = ROOT / "examples"
