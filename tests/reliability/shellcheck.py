"""A static check over the daemon's source: no child process is started through a shell.

Flags, per call site:
- a `shell=` keyword that is not the literal False;
- calls that always use a shell (os.system, os.popen, subprocess.getoutput/getstatusoutput,
  asyncio.create_subprocess_shell, loop.subprocess_shell);
- a process-spawning call (subprocess.*, anyio.open_process/run_process, asyncio
  create_subprocess_exec, procutil.run_command) whose command is a string expression, or a name
  assigned one in the same function (a string command means a shell to anyio and to Popen(shell));
- an argv literal `[<shell>, "-c", ...]` outside the trusted-script runner.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

SPAWNERS = {
    "Popen",
    "run",
    "call",
    "check_call",
    "check_output",
    "open_process",
    "run_process",
    "create_subprocess_exec",
    "run_command",
}
ALWAYS_SHELL = {"system", "popen", "getoutput", "getstatusoutput", "create_subprocess_shell"}
ALWAYS_SHELL_ATTRS = {"subprocess_shell"}
SHELLS = {
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "/bin/sh",
    "/bin/bash",
    "/usr/bin/sh",
    "/usr/bin/bash",
}
# Where `sh -c` is allowed: running the user's trusted `.xum/config.toml` commands.
SHELL_ALLOWED = {"xumd/lifecycle/scripts.py"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.problem}"


def _name(func: ast.expr) -> tuple[str | None, str | None]:
    """(module-ish prefix, attribute/function name) of a call target."""
    if isinstance(func, ast.Attribute):
        base = func.value
        prefix = base.id if isinstance(base, ast.Name) else "<expr>"
        return prefix, func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, None


def _is_stringy(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _is_stringy(node.left) or _is_stringy(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"join", "format"} and _is_stringy(node.func.value)
    return False


def _string_names(func: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and _is_stringy(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and _is_stringy(node.value)
            and isinstance(node.target, ast.Name)
        ):
            names.add(node.target.id)
    return names


def _shell_argv(node: ast.List | ast.Tuple) -> bool:
    items = node.elts
    for first, second in itertools.pairwise(items):
        if (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and first.value in SHELLS
            and isinstance(second, ast.Constant)
            and second.value == "-c"
        ):
            return True
    return False


def check_source(source: str, rel: str) -> list[Finding]:
    tree = ast.parse(source)
    found: list[Finding] = []
    scopes: list[ast.AST] = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    scope_strings = {id(s): _string_names(s) for s in scopes}

    def enclosing_strings(call: ast.Call) -> set[str]:
        out: set[str] = set()
        for scope in scopes:
            end = getattr(scope, "end_lineno", None) or 0
            if scope.lineno <= call.lineno <= end:  # type: ignore[attr-defined]
                out |= scope_strings[id(scope)]
        return out

    for node in ast.walk(tree):
        if (
            isinstance(node, ast.List | ast.Tuple)
            and _shell_argv(node)
            and rel not in SHELL_ALLOWED
        ):
            found.append(Finding(rel, node.lineno, "a shell with -c outside the script runner"))
        if not isinstance(node, ast.Call):
            continue
        prefix, name = _name(node.func)
        for kw in node.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                found.append(Finding(rel, node.lineno, f"{name}(..., shell=...) is not False"))
        # popen is a shell only as os.popen (Popen with a capital P is checked below).
        if name in ALWAYS_SHELL and prefix in {"os", "subprocess", "asyncio", None}:
            found.append(Finding(rel, node.lineno, f"{prefix}.{name} always uses a shell"))
        if name in ALWAYS_SHELL_ATTRS:
            found.append(Finding(rel, node.lineno, f"{name} always uses a shell"))
        if name in SPAWNERS and node.args:
            command = node.args[0]
            if name == "run" and prefix != "subprocess":
                continue  # anyio.run, git.run, scripts.run, ... take no command string
            if _is_stringy(command) or (
                isinstance(command, ast.Name) and command.id in enclosing_strings(node)
            ):
                found.append(Finding(rel, node.lineno, f"{name}() given a string command"))
    return found


def check_tree(package: Path) -> list[Finding]:
    found: list[Finding] = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package.parent))
        found.extend(check_source(path.read_text(encoding="utf-8"), rel))
    return found
