"""mkdocs hooks (mkdocs.yml `hooks:`): in the API reference, a class member's table-of-contents entry,
and so its search title, names its class (`Module.lazy_reset_grad`, `TrainingSession.lazy_reset_grad`)."""

from __future__ import annotations

from typing import Any


def _name_owners(items: Any) -> None:
    for item in items:
        parts = item.id.split(".")
        if len(parts) >= 2 and parts[-2][:1].isupper() and item.title == parts[-1]:
            item.title = f"{parts[-2]}.{parts[-1]}"
        _name_owners(item.children)


def on_page_content(html: str, page: Any, **_: Any) -> str:
    """Member entries of api.md's table of contents read ``Class.member``."""
    if page.file.src_uri == "api.md":
        _name_owners(page.toc)
    return html
