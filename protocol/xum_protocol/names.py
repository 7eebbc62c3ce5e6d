"""Name rules shared by the daemon and clients (so a client can check before it asks)."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def name_problem(name: str) -> str | None:
    """Why `name` is not a valid project/workspace name, or None when it is."""
    if not 1 <= len(name) <= 64:
        return "a name has 1 to 64 characters"
    if not NAME_RE.fullmatch(name):
        return (
            "a name uses letters, digits, '.', '_' and '-' only, and does not start with '.' or '-'"
        )
    if ".." in name:
        return "a name may not contain '..'"
    return None
