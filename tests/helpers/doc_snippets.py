"""The ```python blocks of README.md and docs/*.md, as one program per page (its blocks chained in order).

A block may sit indented in a collapsed admonition (``??? example "Setup: ..."``, shown folded on the
site): setup a reader needs is shown that way, never hidden. Markers, HTML comments that the
rendered page does not show:

- ``<!-- snippet: skip (reason) -->`` right before a block (blank lines between allowed): the block is
  not run (CUDA only, needs torchrun, a placeholder path ...); the reason is required.
- ``<!-- snippet: check``, then Python lines, then ``-->``: hidden code run at that point of the page's
  program (assert what a block promises). ``<!-- snippet: setup`` is read the same way, but no page
  may use it (tests/integration/test_docs_pasted.py): a reader cannot paste what the site hides.

``python -m tests.helpers.doc_snippets`` lists every page's blocks, run or skipped with the reason.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.paths import ROOT

# a fence at the line start, or indented inside a collapsed admonition (``??? example "Setup: ..."``)
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.DOTALL | re.MULTILINE)
HIDDEN = re.compile(r"^<!-- snippet: (?:setup|check)[^\n]*\n(.*?)^-->[ \t]*$", re.DOTALL | re.MULTILINE)
SKIP = re.compile(r"<!-- snippet: skip \((?P<reason>[^)]+)\) -->\s*\Z")
ANY_MARKER = re.compile(r"<!-- snippet: (\w+)")


@dataclass(frozen=True)
class Block:
    """One piece of a page's program: a shown block or hidden code, with where it starts."""

    page: Path
    line: int  # 1-based line of the block's first code line in the page
    code: str
    hidden: bool
    skip_reason: str | None

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every docs/*.md page (new pages are picked up as they appear)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_blocks(page: Path) -> list[Block]:
    """The page's shown Python blocks and hidden setup/check code, in page order."""
    return parse_blocks(page, page.read_text())


def parse_blocks(page: Path, text: str) -> list[Block]:
    """``page_blocks`` of a page whose text is ``text``."""
    for marker in ANY_MARKER.findall(text):
        if marker not in ("skip", "setup", "check"):
            raise ValueError(f"{page}: unknown snippet marker {marker!r} (skip, setup or check)")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()]
        skip = SKIP.search(before)
        line = before.count("\n") + 2
        code = textwrap.dedent(match.group("code")) if match.group("indent") else match.group("code")
        found.append(Block(page, line, code, False, skip.group("reason") if skip else None))
    for match in HIDDEN.finditer(text):
        line = text[: match.start()].count("\n") + 2
        found.append(Block(page, line, match.group(1), True, None))
    return sorted(found, key=lambda block: block.line)


def program(blocks: list[Block]) -> list[tuple[str, str]]:
    """(file name, code) pairs to execute in one namespace, skipped blocks left out; each code is
    padded with blank lines so that tracebacks give the page's own line numbers."""
    return [
        (str(block.page.relative_to(ROOT)), "\n" * (block.line - 1) + block.code)
        for block in blocks
        if block.skip_reason is None
    ]


RUNNER = """\
import json, sys
namespace = {"__name__": "__main__"}
for filename, code in json.load(sys.stdin):
    exec(compile(code, filename, "exec"), namespace)
"""


def main() -> None:
    for page in pages():
        blocks = [block for block in page_blocks(page) if not block.hidden]
        if blocks:
            print(f"{page.relative_to(ROOT)}: {len(blocks)} blocks")
        for block in blocks:
            print(f"  line {block.line}: " + (f"skipped ({block.skip_reason})" if block.skip_reason else "run"))


if __name__ == "__main__":
    sys.exit(main())
