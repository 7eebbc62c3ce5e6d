"""No module of the daemon asks which system it runs on, but the platform seam
(`daemon/xumd/system/platform/`): a `sys.platform` or `platform.system()` check elsewhere is
code that one backend's test run never reaches (docs/RELIABILITY.md, "Platforms")."""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[2] / "daemon" / "xumd"
SEAM = DAEMON / "system" / "platform"

# `sys.platform`, the stdlib `platform` module's questions, and `os.uname()`.
ASKS = {("sys", "platform"), ("os", "uname")}
STDLIB_PLATFORM = "platform"


def system_checks(source: str, name: str) -> list[str]:
    """Where `source` asks which system it runs on: `sys.platform`, `os.uname`, or any use of
    the stdlib `platform` module (`import platform`, `from platform import ...`)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in ASKS:
                found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == STDLIB_PLATFORM:
                    found.append(f"{name}:{node.lineno}: import platform")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module == STDLIB_PLATFORM:
                found.append(f"{name}:{node.lineno}: from platform import")
            for alias in node.names:
                if node.module == "sys" and alias.name == "platform":
                    found.append(f"{name}:{node.lineno}: from sys import platform")
    return found


def test_no_system_check_outside_the_platform_seam() -> None:
    found = [
        hit
        for path in sorted(DAEMON.rglob("*.py"))
        if SEAM not in path.parents
        for hit in system_checks(path.read_text(encoding="utf-8"), str(path.relative_to(DAEMON)))
    ]
    assert found == [], "ask the platform seam (xumd.system.platform.current()) instead"


def test_the_check_finds_each_way_of_asking() -> None:
    source = "\n".join(
        [
            "import sys, os",
            "import platform",
            "from platform import system",
            "from sys import platform as p",
            "LINUX = sys.platform.startswith('linux')",
            "HOST = os.uname().sysname",
            "from xumd.system import platform as seam",  # the seam itself: not a check
        ]
    )
    assert [hit.split(": ", 1)[1] for hit in system_checks(source, "m.py")] == [
        "import platform",
        "from platform import",
        "from sys import platform",
        "sys.platform",
        "os.uname",
    ]


def test_the_seam_is_where_the_system_is_asked() -> None:
    hits = system_checks((SEAM / "__init__.py").read_text(encoding="utf-8"), "__init__.py")
    assert any("sys.platform" in hit for hit in hits)
