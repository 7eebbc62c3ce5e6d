"""A branch name that is certainly valid for git, decided without running git.

`git check-ref-format --branch` costs a process (milliseconds in the daemon) on every create.
The rule here is deliberately narrower than git's (git-check-ref-format(1)): slash-separated
components of ASCII letters, digits, `_`, `.` and `-`, none starting with `.` or `-`, none
ending with `.` or `.lock`, no `..`, and not `HEAD`. Every name it accepts is valid for git
(each of git's refusals needs a character or a shape this excludes); a name it does not accept
is not refused here: the caller asks git, which decides as before.
"""

from __future__ import annotations

import re

_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def plain_branch_name(name: str) -> bool:
    """True only for a name git certainly accepts as a branch (see the module's rule)."""
    if name == "HEAD" or ".." in name:
        return False
    for part in name.split("/"):
        if not _COMPONENT.fullmatch(part) or part.endswith((".", ".lock")):
            return False
    return True
