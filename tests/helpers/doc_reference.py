"""Checks of the built API reference (site/api/index.html): each documented class whose constructor
takes parameters documents every one of them, with its type (no tests here)."""

from __future__ import annotations

import html
import re

HEADING = re.compile(r'<h2 id="([^"]+)" class="doc doc-heading">')


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def class_sections(page: str) -> dict[str, str]:
    """Each class heading's id -> its own part of the page (its signature and docstring, before its members)."""
    found = {}
    starts = [(match.start(), match.group(1)) for match in HEADING.finditer(page)]
    for (start, name), (end, _) in zip(starts, starts[1:] + [(len(page), "")]):
        section = page[start:end]
        if "doc-symbol-class" in section[:3000]:
            found[name] = section.split("<h3", 1)[0]
    return found


def signature_parameters(section: str) -> list[str]:
    """The parameter names of the section's signature (the merged ``__init__``)."""
    match = re.search(r'class="doc-signature[^"]*"[^>]*>(.*?)</div>', section, re.S)
    if match is None:
        return []
    text = _text(match.group(1))
    inside = text[text.find("(") + 1 : text.rfind(")")] if "(" in text else ""
    pieces, depth, current = [], 0, ""
    for char in inside:  # split at the commas outside brackets
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        if char == "," and depth == 0:
            pieces.append(current)
            current = ""
        else:
            current += char
    pieces.append(current)
    names = [re.match(r"\s*\**(\w*)", piece).group(1) for piece in pieces]  # type: ignore[union-attr]
    return [name for name in names if name and name != "self"]


def documented_parameters(section: str) -> dict[str, str]:
    """Parameter name -> its documented type, from the section's "Parameters:" table."""
    table = section.split("Parameters:", 1)
    if len(table) < 2:
        return {}
    rows = re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table[1].split("</table>", 1)[0], re.S)
    documented = {}
    for row in rows:
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        if len(cells) >= 2:
            documented[_text(cells[0]).strip()] = " ".join(_text(cells[1]).split())
    return documented


def undocumented_constructors(page: str) -> list[str]:
    """``Class: parameter`` for every constructor parameter without a documented entry and type."""
    missing = []
    for name, section in class_sections(page).items():
        documented = documented_parameters(section)
        for parameter in signature_parameters(section):
            if not documented.get(parameter):
                missing.append(f"{name}: {parameter}")
    return missing
