"""The CLI's user-error type (kept free of heavy imports: the parser and ``main`` load it first)."""

from __future__ import annotations


class CliError(Exception):
    """A user error: reported as one line on stderr, exit status 1."""
