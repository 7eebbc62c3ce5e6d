"""Wiring that cannot fail open: a collaborator is a constructor argument, never assigned onto an
object after it is built (docs/ARCHITECTURE.md, "Wiring fails at start").

Read from the source: a "wired" attribute is one some class's `__init__` sets from a parameter
whose annotation names a type (not a plain value: str, int, Path, ...). No module assigns a wired
attribute on anything but `self`, and the wiring modules (each feature's `feature.py`, the
composition root) assign no attribute of any object at all. That the built objects hold what they
were given, and that a graph without one fails while it is built, is
tests/daemon/test_app_composition.py's.
"""

from __future__ import annotations

import ast
from pathlib import Path

DAEMON = Path(__file__).resolve().parents[2] / "daemon" / "xumd"

PLAIN = {
    "str",
    "int",
    "float",
    "bool",
    "bytes",
    "Path",
    "list",
    "dict",
    "set",
    "tuple",
    "frozenset",
    "None",
    "Any",
    "object",
    "Sequence",
    "Mapping",
    "Iterable",
}

WIRING = (
    "feature.py",
    "startup/feature_graph.py",
    "startup/composition.py",
    "startup/lazy_start.py",
)
"""Where collaborators are built and handed over (with every `*feature.py`)."""

ALLOWED: dict[tuple[str, str], str] = {
    # A data record's field that shares its name with a collaborator elsewhere.
    ("cleanup/status.py", "status.obligations"): "the CleanupStatus model's list of ids",
    ("lifecycle/preserved.py", "settled.problems"): "a settle result's list of problems",
    ("lifecycle/snapshot.py", "dropped.paths"): "a dropped-files record's list of paths",
    ("processes/supervisor.py", "self.tasks.stopping"): "the supervisor's own task set's flag",
    ("recovery/reconcile.py", "report.turns"): "the recovery report's counts",
    # Runtime state a handler records, not a collaborator.
    ("daemon/feature.py", "ctx.peer.protocol"): "hello records the protocol the peer speaks",
}


def _names(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    found = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    found |= {n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)}
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        found |= _names(ast.parse(annotation.value, mode="eval").body)
    return found


def wired_attributes(trees: dict[str, ast.Module]) -> set[str]:
    wired: set[str] = set()
    for tree in trees.values():
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            for fn in cls.body:
                if not (isinstance(fn, ast.FunctionDef) and fn.name == "__init__"):
                    continue
                params = {a.arg: a.annotation for a in fn.args.args + fn.args.kwonlyargs}
                for node in ast.walk(fn):
                    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)):
                        continue
                    param = node.value.id
                    if param not in params or not (_names(params[param]) - PLAIN):
                        continue
                    for target in node.targets:
                        if _on_self(target):
                            assert isinstance(target, ast.Attribute)
                            wired.add(target.attr)
    return wired


def _on_self(target: ast.expr) -> bool:
    return (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id in ("self", "cls")
    )


def late_assignments(trees: dict[str, ast.Module], wired: set[str]) -> list[str]:
    """`module: target` for each attribute assignment that binds a collaborator late."""
    found: list[str] = []
    for name, tree in trees.items():
        wiring = name.endswith(WIRING)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if not isinstance(target, ast.Attribute) or _on_self(target):
                    continue
                text = ast.unparse(target)
                if (wiring or target.attr in wired) and (name, text) not in ALLOWED:
                    found.append(f"{name}:{node.lineno}: {text}")
    return found


def _daemon_trees() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(DAEMON)): ast.parse(path.read_text())
        for path in sorted(DAEMON.rglob("*.py"))
    }


def test_no_collaborator_is_assigned_after_construction() -> None:
    trees = _daemon_trees()
    found = late_assignments(trees, wired_attributes(trees))
    assert not found, (
        "collaborators assigned after construction (make them constructor arguments, built "
        "before what takes them: docs/DEVELOPING.md): " + "; ".join(found)
    )


def test_the_allowances_are_still_needed() -> None:
    """Each allowance names an assignment that exists: one left behind would hide a new one."""
    trees = _daemon_trees()
    present = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                present |= {(name, ast.unparse(t)) for t in node.targets}
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                present.add((name, ast.unparse(node.target)))
    assert set(ALLOWED) <= present, set(ALLOWED) - present


def test_the_check_finds_a_late_binding() -> None:
    """The shape the lifecycle hooks once had: a feature plugging its collaborator into an
    object another feature built."""
    service = ast.parse(
        "class Hooks:\n"
        "    def __init__(self, processes: 'Holders | None') -> None:\n"
        "        self.processes = processes\n"
    )
    elsewhere = ast.parse("def install(hooks, quiet):\n    q = quiet\n    hooks.processes = q\n")
    feature = ast.parse("def install(app, sweep):\n    app.sweep = sweep\n")
    trees = {
        "lifecycle/hooks.py": service,
        "processes/quiet.py": elsewhere,
        "x/feature.py": feature,
    }
    wired = wired_attributes(trees)
    assert wired == {"processes"}
    assert late_assignments(trees, wired) == [
        "processes/quiet.py:3: hooks.processes",
        "x/feature.py:2: app.sweep",
    ]
