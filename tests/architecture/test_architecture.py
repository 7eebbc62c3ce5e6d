"""The import rule: which package may import which, read from the source (no import-linter).

Every `import` and `from ... import` counts, wherever it stands (module level, inside a
function, under `TYPE_CHECKING`): a lazy import is still a dependency. A *unit* is a package or
a top-level module of `xumd` (`xumd.cleanup`, `xumd.system.git`), of `xum_client`
(`xum_client.commands`, `xum_client.cli`), or the whole of `xum_protocol`. docs/DEVELOPING.md says
how to extend the table.

The rule:
- `LAYERS` lists every unit, lowest first. A unit may import units of strictly lower layers only:
  a back-edge, or an edge inside one layer, fails and names the importing line. A unit missing
  from the table fails too (place it: that is the decision the table records).
- No import cycle between any two modules (so no part imports the facade that imports it).
- `FACADES` names each facade and the parts it is built from: no part imports its facade.
- The daemon never looks code up by name (`importlib.import_module`, `__import__`): the
  composition root hands each feature its collaborators.
- `NO_TRANSPORT`: lifecycle and cleanup import rpc only in their `feature.py` (the handlers'
  registration); an operation reaches the dispatcher through `xumd.base.requestcut`.
- `TABLE_OWNERS`: every table of the store's migrations has one owning module; no other module
  names it in SQL (read from its string literals), except the pairs `SQL_ALLOWED` lists, and that
  list stays true (a listed pair that no longer occurs fails too).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = {
    "xumd": REPO / "daemon" / "xumd",
    "xum_client": REPO / "clients" / "xum_client",
    "xum_protocol": REPO / "protocol" / "xum_protocol",
}

LAYERS: list[tuple[str, list[str]]] = [
    # The wire protocol: imports nothing of the daemon or the client (checked below too).
    ("protocol", ["xum_protocol"]),
    # -- the daemon, lowest first, folder by folder (FOLDERS) -----------------------------------
    # base/: what every part reads; imports nothing of xumd outside base/.
    (
        "base",
        [
            "xumd",
            "xumd.base",
            "xumd.system",
            "xumd.startup",
            "xumd.base.errors",
            "xumd.base.logs",
            "xumd.base.paths",
            "xumd.base.config",
            "xumd.base.faults",
            # The answer of a request cut at shutdown: the operations say it, rpc reads it.
            "xumd.base.requestcut",
            # A keyed request's target: the operations bind it, rpc records it.
            "xumd.base.requestkey",
        ],
    ),
    # The configuration's pydantic schema, derived from its tables (docs and tests only); the
    # event bus.
    ("base, above logs and config", ["xumd.base.config_schema", "xumd.base.events"]),
    # system/: the operating system and git, below every feature.
    # The platform seam: everything asked of the operating system, one backend per system.
    ("platform", ["xumd.system.platform"]),
    # The one walk of a tree by descriptor: below every part that walks one.
    ("tree walk", ["xumd.system.walk"]),
    (
        "system leaves",
        [
            "xumd.system.fsdelete",
            "xumd.system.sdnotify",
            "xumd.system.childproc",
            "xumd.system.smallfile",
            "xumd.system.atomicfile",
            "xumd.system.indexstat",
        ],
    ),
    (
        "os",
        ["xumd.system.diskfull", "xumd.system.fdlimits", "xumd.system.loop_exceptions"],
    ),
    ("copy by descriptor, process identity", ["xumd.system.fscopy", "xumd.system.procstat"]),
    # The raw copy and the clone build on the copy; the root lock records its holder's start as
    # psutil would.
    (
        "raw copy, clone, root lock",
        ["xumd.system.rawcopy", "xumd.system.reflink", "xumd.system.rootlock"],
    ),
    ("containment, git locks", ["xumd.system.containment", "xumd.system.gitlocks"]),
    ("children", ["xumd.system.procutil"]),
    ("git", ["xumd.system.git"]),
    ("store", ["xumd.store"]),
    ("transport", ["xumd.rpc"]),
    ("runtime", ["xumd.app"]),
    # What lifecycle and cleanup share: a checkout's identity and the directory exclusion.
    ("checkouts", ["xumd.checkouts"]),
    # Features, each above those it uses: lifecycle uses cleanup, never the other way.
    ("cleanup", ["xumd.cleanup"]),
    ("lifecycle", ["xumd.lifecycle"]),
    ("processes", ["xumd.processes"]),
    ("turns", ["xumd.turns"]),
    ("usage", ["xumd.usage"]),
    ("recovery", ["xumd.recovery"]),
    ("gc", ["xumd.gc"]),
    # daemon/: hello, status, shutdown, events; the containment's install.
    ("daemon-wide features", ["xumd.daemon"]),
    # startup/: the feature graph's installs; what a lean start serves before building it; the
    # composition root; the run sequence; the entry point.
    ("feature graph", ["xumd.startup.feature_graph", "xumd.startup.lazy_start"]),
    ("composition root", ["xumd.startup.composition"]),
    ("start-up", ["xumd.startup.runner"]),
    ("entry", ["xumd.startup.main"]),
    ("python -m", ["xumd.__main__"]),
    # -- the client ----------------------------------------------------------------------------
    # hostprune: shipped to a host as source and run there alone, so it imports no xum at all.
    (
        "client leaves",
        ["xum_client.errors", "xum_client.units", "xum_client.paging", "xum_client.hostprune"],
    ),
    # Which workspace a directory is in (`xum self`, the MCP tool current_workspace).
    ("where am I", ["xum_client.locate"]),
    # Hosts (docs/HOSTS.md): the hosts file and ssh command, the bridge, the ssh transport.
    ("hosts", ["xum_client.hosts", "xum_client.bridge"]),
    ("host transport", ["xum_client.sshlink"]),
    ("client", ["xum_client.sync"]),
    ("client api", ["xum_client.aio", "xum_client.install", "xum_client.hostinstall"]),
    ("one view", ["xum_client.allhosts"]),
    ("client package", ["xum_client"]),
    # `xum mcp`: the MCP server, a client of the daemon; only its `server` imports the MCP SDK.
    ("mcp server", ["xum_client.mcp"]),
    ("cli parts", ["xum_client.commands"]),
    ("cli", ["xum_client.cli"]),
    # `xum`'s entry: answers `xum status` itself, hands everything else to the cli.
    ("cli entry", ["xum_client.entry"]),
]

# Folders whose modules are placed one by one (each a layer's unit of its own).
LAYERED_FOLDERS = {"base", "system", "startup"}
# `daemon/xumd/`'s folders, lowest layer first (the runtime `app.py` stands alone, as does
# `__main__.py`): what `ls` shows is the layer table's order.
FOLDERS = [
    "base",
    "system",
    "store",
    "rpc",
    "app",
    "checkouts",
    "cleanup",
    "lifecycle",
    "processes",
    "turns",
    "usage",
    "recovery",
    "gc",
    "daemon",
    "startup",
    "__main__",
]

FACADES: dict[str, list[str]] = {
    # facade: the parts it is built from (none may import it)
    "xumd.cleanup.service": [
        "xumd.cleanup.planning",
        "xumd.cleanup.runner",
        "xumd.cleanup.cycle",
        "xumd.cleanup.outcomes",
        "xumd.cleanup.status",
        "xumd.cleanup.steps",
        "xumd.cleanup.teardown_scripts",
        "xumd.cleanup.schedule",
    ],
    "xumd.lifecycle.service": [
        "xumd.lifecycle.context",
        "xumd.lifecycle.create",
        "xumd.lifecycle.archive",
        "xumd.lifecycle.unarchive",
        "xumd.lifecycle.remove",
        "xumd.lifecycle.rename",
        "xumd.lifecycle.keep_interrupted",
    ],
    "xumd.processes.supervisor": [
        "xumd.processes.adoption",
        "xumd.processes.foreground",
        "xumd.processes.starting",
        "xumd.processes.watching",
        "xumd.processes.settlement",
        "xumd.processes.stopping",
        "xumd.processes.process_io",
        "xumd.processes.state",
    ],
    "xum_client.cli": [
        "xum_client.commands._context",
        "xum_client.commands._progress",
        "xum_client.commands._resolve",
        "xum_client.commands.cleanup",
        "xum_client.commands.hosts",
        "xum_client.commands.process",
        "xum_client.commands.project",
        "xum_client.commands.turn",
        "xum_client.commands.workspace",
    ],
}

LOOKUP_BY_NAME_ALLOWED = {
    # The CLI loads a domain's command module on first use (start-up time): its own parts, by
    # their package path, never a service.
    "xum_client.cli",
}


# The domain does not talk back to the transport: only a feature's `install` (its `feature.py`,
# which registers handlers on the router) imports rpc; the operations reach the dispatcher
# through `xumd.base.requestcut`.
NO_TRANSPORT = ("xumd.lifecycle", "xumd.cleanup")

# Every table of daemon/xumd/store/migrations, and the one module that names it in SQL: its
# queries and row types live there, and other modules call its functions.
TABLE_OWNERS: dict[str, str] = {
    "meta": "xumd.store",
    "projects": "xumd.lifecycle.rows",
    "workspaces": "xumd.lifecycle.rows",
    "workspace_tombstones": "xumd.lifecycle.rows",
    "rename_journal": "xumd.lifecycle.rows",
    "workspace_env": "xumd.lifecycle.wsenv",
    "workspace_ports": "xumd.lifecycle.ports",
    "workspace_sparse": "xumd.lifecycle.sparse_cone",
    "workspace_removing": "xumd.lifecycle.rows",
    "workspace_listing_counter": "xumd.lifecycle.listing",
    "cleanup_obligations": "xumd.cleanup.obligations",
    "leases": "xumd.processes.leases",
    "workspace_activity": "xumd.processes.leases",
    "turns": "xumd.turns.rows",
    "gc_runs": "xumd.gc.runs",
    "request_keys": "xumd.rpc.requestkeys",
    "pool_entries": "xumd.lifecycle.pool",
}

# The modules that still name a table they do not own: (module, table): why. Only shrinks: move
# the statement into the owner (or behind a port the composition root wires), then drop the pair.
SQL_ALLOWED: dict[tuple[str, str], str] = {
    # workspace.list's read model: one query joins what a page shows; split, it would cost a
    # query per row (workspace.list is measured: docs/PERFORMANCE.md, bench/).
    ("xumd.lifecycle.listing", "workspaces"): "workspace.list's one-query read model",
    ("xumd.lifecycle.listing", "cleanup_obligations"): "workspace.list's one-query read model",
    ("xumd.lifecycle.listing", "workspace_env"): "workspace.list's one-query read model",
    ("xumd.lifecycle.listing", "workspace_ports"): "workspace.list's one-query read model",
}

_MIGRATIONS = SOURCES["xumd"] / "store" / "migrations"


def _tables(migrations: Path = _MIGRATIONS) -> set[str]:
    found: set[str] = set()
    for sql in sorted(migrations.glob("*.sql")):
        found.update(
            m.group(1).lower()
            for m in re.finditer(
                r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", sql.read_text(), re.I
            )
        )
    return found


def sql_uses(known: dict[str, Path], tables: set[str]) -> dict[tuple[str, str], list[str]]:
    """(module, table) -> where (path:line) for each SQL string literal of `xumd` naming the
    table after FROM, INTO, UPDATE (OR ...) or JOIN (DELETE FROM and INSERT OR ... INTO included).
    The line is the literal's (the first piece's, for pieces Python joins) plus the newlines
    before the name."""
    names = "|".join(sorted(tables))
    pattern = re.compile(rf"\b(?:FROM|INTO|UPDATE(?:\s+OR\s+\w+)?|JOIN)\s+({names})\b", re.I)
    uses: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in sorted(known.items()):
        if module.partition(".")[0] != "xumd":
            continue
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            for match in pattern.finditer(node.value):
                line = node.lineno + node.value.count("\n", 0, match.start())
                uses[(module, match.group(1).lower())].append(f"{shown}:{line}")
    return uses


def _owns(owner: str, module: str) -> bool:
    return module == owner or module.startswith(owner + ".")


def ownership_violations(
    uses: dict[tuple[str, str], list[str]], allowed: dict[tuple[str, str], str]
) -> list[str]:
    problems = []
    for (module, table), where in sorted(uses.items()):
        if _owns(TABLE_OWNERS[table], module) or (module, table) in allowed:
            continue
        problems.extend(
            f"{w}: {module} names table {table!r} in SQL, but {TABLE_OWNERS[table]} owns it: "
            "call the owner's function"
            for w in where
        )
    problems.extend(
        f"SQL_ALLOWED lists ({module!r}, {table!r}), which no longer occurs: drop it"
        for module, table in sorted(allowed.keys() - uses.keys())
    )
    return problems


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line, for the failure message


def _modules(top: str, root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = (top, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, known: dict[str, Path]) -> tuple[list[Edge], list[str]]:
    """The module's edges to known modules, and its lookups by name (`where` of each)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges: list[Edge] = []
    lookups: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        where = f"{shown}:{getattr(node, 'lineno', 0)}"
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            if any(alias.name == "importlib" for alias in node.names):
                lookups.append(where)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from pkg import mod` depends on pkg.mod when that is a module, else on pkg.
            names = [f"{base}.{alias.name}" for alias in node.names]
            if base == "importlib" and any(a.name == "import_module" for a in node.names):
                lookups.append(where)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            lookups.append(where)
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                edges.append(Edge(module, target, where))
    return edges, lookups


def _graph(
    sources: dict[str, Path] | None = None,
) -> tuple[dict[str, Path], list[Edge], dict[str, list[str]]]:
    known: dict[str, Path] = {}
    for top, root in (sources or SOURCES).items():
        known.update(_modules(top, root))
    edges: list[Edge] = []
    lookups: dict[str, list[str]] = {}
    for module, path in sorted(known.items()):
        found, by_name = _imports(module, path, known)
        edges.extend(found)
        if by_name:
            lookups[module] = by_name
    return known, edges, lookups


def unit_of(module: str) -> str:
    top, _, rest = module.partition(".")
    if top == "xum_protocol" or not rest:
        return top
    parts = rest.split(".")
    if top == "xumd" and parts[0] in LAYERED_FOLDERS and len(parts) > 1:
        # A folder of layers: each module is a unit of its own, placed in the table.
        return f"{top}.{parts[0]}.{parts[1]}"
    return f"{top}.{parts[0]}"


def folder_of(unit: str) -> str:
    """The folder (or top-level module) of `daemon/xumd/` a daemon unit sits in."""
    parts = unit.split(".")
    return parts[1] if len(parts) > 1 else "xumd"


def folder_violations(known: dict[str, Path]) -> list[str]:
    """`ls daemon/xumd` shows the layers: the table's daemon layers visit each folder once, in
    the order FOLDERS gives, and no module but the package's own sits at the top."""
    problems = [
        f"daemon/xumd/{m.split('.')[1]}.py sits at the top: put it in the folder of its layer"
        for m in sorted(known)
        if m.startswith("xumd.")
        and m.count(".") == 1
        and known[m].name != "__init__.py"
        and m not in {"xumd.__main__", "xumd.app"}
    ]
    seen: list[str] = []
    for name, units in LAYERS:
        for unit in units:
            if not unit.startswith("xumd.") or unit in {"xumd.base", "xumd.system", "xumd.startup"}:
                continue
            folder = folder_of(unit)
            if folder not in FOLDERS:
                problems.append(f"{unit} (layer {name!r}) sits in {folder!r}, not in FOLDERS")
                continue
            if seen and seen[-1] != folder and folder in seen:
                problems.append(f"{unit} (layer {name!r}) returns to folder {folder!r}")
            if not seen or seen[-1] != folder:
                seen.append(folder)
    order = [folder for folder in FOLDERS if folder in seen]
    if seen != order:
        problems.append(f"the layers visit the folders as {seen}, FOLDERS says {order}")
    return problems


def layer_violations(known: dict[str, Path], edges: list[Edge]) -> list[str]:
    rank: dict[str, int] = {}
    for index, (_name, units) in enumerate(LAYERS):
        for unit in units:
            assert unit not in rank, f"{unit} is in two layers"
            rank[unit] = index
    problems = [
        f"{unit} is in no layer of tests/architecture/test_architecture.py (LAYERS): place it"
        for unit in sorted({unit_of(m) for m in known} - rank.keys())
    ]
    for edge in edges:
        source, target = unit_of(edge.source), unit_of(edge.target)
        if source == target or source not in rank or target not in rank:
            continue
        if rank[target] >= rank[source]:
            problems.append(
                f"{edge.where}: {edge.source} imports {edge.target}, but {source} "
                f"(layer {LAYERS[rank[source]][0]!r}) may import only lower layers, and "
                f"{target} is in layer {LAYERS[rank[target]][0]!r}"
            )
    return problems


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def facade_violations(edges: list[Edge]) -> list[str]:
    reach: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        reach[edge.source].add(edge.target)
    problems = []
    for facade, parts in FACADES.items():
        for part in parts:
            seen: set[str] = set()
            todo = [part]
            while todo:
                here = todo.pop()
                for nxt in reach.get(here, ()):
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            if facade in seen:
                problems.append(f"{part} imports its facade {facade} (directly or through others)")
    return problems


def transport_violations(edges: list[Edge]) -> list[str]:
    return [
        f"{edge.source} imports {edge.target} ({edge.where})"
        for edge in edges
        if unit_of(edge.source) in NO_TRANSPORT
        and not edge.source.endswith(".feature")
        and unit_of(edge.target) == "xumd.rpc"
    ]


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Edge], dict[str, list[str]]]:
    return _graph()


def test_every_unit_imports_only_lower_layers(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    known, edges, _ = graph
    assert layer_violations(known, edges) == []


def test_the_folders_show_the_layers(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    known, _, _ = graph
    assert folder_violations(known) == []


def test_no_import_cycle_between_modules(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    _, edges, _ = graph
    assert cycles(edges) == []


def test_no_part_imports_its_facade(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    known, edges, _ = graph
    for facade, parts in FACADES.items():
        missing = [m for m in [facade, *parts] if m not in known]
        assert missing == [], f"FACADES names modules that do not exist: {missing}"
    assert facade_violations(edges) == []


def test_the_operations_do_not_import_the_transport(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    _, edges, _ = graph
    assert transport_violations(edges) == []


def test_no_lookup_by_name(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    _, _, lookups = graph
    assert {m: w for m, w in lookups.items() if m not in LOOKUP_BY_NAME_ALLOWED} == {}


def test_every_table_has_one_owner(
    graph: tuple[dict[str, Path], list[Edge], dict[str, list[str]]],
) -> None:
    known, _, _ = graph
    assert _tables() == TABLE_OWNERS.keys(), "a table without an owner in TABLE_OWNERS, or gone"
    for owner in TABLE_OWNERS.values():
        assert owner in known, f"TABLE_OWNERS names {owner}, which does not exist"
    assert ownership_violations(sql_uses(known, _tables()), SQL_ALLOWED) == []


def test_table_ownership_is_checked_for_what_it_claims(tmp_path: Path) -> None:
    """A module naming a table it does not own fails, with its file, line and table; a pair of
    SQL_ALLOWED that no longer occurs fails too."""
    import shutil

    root = tmp_path / "xumd"
    shutil.copytree(SOURCES["xumd"], root, ignore=shutil.ignore_patterns("__pycache__"))
    with (root / "usage" / "service.py").open("a") as handle:
        handle.write('\n\n_Q = (\n    "SELECT id"\n    " FROM turns WHERE 1"\n)\n')
    lines = (root / "usage" / "service.py").read_text().count("\n")
    known, _, _ = _graph({"xumd": root})
    uses = sql_uses(known, _tables())
    problems = ownership_violations(uses, SQL_ALLOWED)
    assert any(
        p.endswith(
            f"usage/service.py:{lines - 2}: xumd.usage.service names table 'turns' in "
            "SQL, but xumd.turns.rows owns it: call the owner's function"
        )
        for p in problems
    ), problems
    stale = {**SQL_ALLOWED, ("xumd.usage.service", "leases"): "gone"}
    assert any(
        "('xumd.usage.service', 'leases'), which no longer occurs" in p
        for p in ownership_violations(uses, stale)
    )


def test_the_table_is_checked_for_what_it_claims(tmp_path: Path) -> None:
    """The checks fail on what they forbid: a back-edge (cleanup importing lifecycle), a cycle,
    a part importing its facade, a lookup by name, an operation importing the transport and an
    unplaced unit, in a copy of the tree."""
    import shutil

    root = tmp_path / "xumd"
    shutil.copytree(SOURCES["xumd"], root, ignore=shutil.ignore_patterns("__pycache__"))
    sources = {**SOURCES, "xumd": root}
    known, edges, lookups = _graph(sources)
    assert layer_violations(known, edges) == [] and cycles(edges) == []

    with (root / "cleanup" / "steps.py").open("a") as handle:
        handle.write("\nfrom xumd.lifecycle import rows  # back-edge\n")
    with (root / "processes" / "watching.py").open("a") as handle:
        handle.write("\ndef _f() -> None:\n    from xumd.processes.supervisor import Supervisor\n")
    with (root / "lifecycle" / "archive.py").open("a") as handle:
        handle.write("\nimport importlib\nfrom xumd.rpc.dispatch import RequestContext\n")
    (root / "newthing.py").write_text("")
    known, edges, lookups = _graph(sources)

    layers = layer_violations(known, edges)
    assert any("xumd.cleanup.steps imports xumd.lifecycle.rows" in p for p in layers), layers
    assert any("xumd.newthing is in no layer" in p for p in layers), layers
    assert any("xumd.processes.supervisor" in c for c in cycles(edges))
    assert any("xumd.processes.watching imports its facade" in p for p in facade_violations(edges))
    assert "xumd.lifecycle.archive" in lookups
    assert any("xumd.lifecycle.archive imports xumd.rpc" in p for p in transport_violations(edges))


if __name__ == "__main__":  # print the unit graph (for docs and for placing a new unit)
    _known, _edges, _ = _graph()
    deps: dict[str, set[str]] = defaultdict(set)
    for _edge in _edges:
        if unit_of(_edge.source) != unit_of(_edge.target):
            deps[unit_of(_edge.source)].add(unit_of(_edge.target))
    for _unit in sorted({unit_of(m) for m in _known}):
        sys.stdout.write(f"{_unit}: {', '.join(sorted(deps[_unit]))}\n")
