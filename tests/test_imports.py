"""The module graph's layering, read with `ast` (the project is never imported).

Every `import` and `from ... import` anywhere in a file counts: module level,
function-local, and under `if TYPE_CHECKING:`. Relative imports are resolved.

Layers (docs/architecture.md), bottom up: `schemas` (the data contract), then `core`
(settings, database, keys, feedback records) on it, with `engine` beside them; `trainer`
on those; `gateway` on them, entering the trainer only through `trainer.api`; `rlgate`
(the product's commands: the command line, `up`, `demo`, `export`) above everything,
and nothing below imports it. Inside `gateway`, its subpackages are layered too
(`GATEWAY_LAYERS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rlgate", "core", "gateway", "trainer", "engine", "schemas")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        base = ROOT / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name this module imports (a `from a import b` gives `a` and `a.b`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                drop = node.level - 1
                if drop:
                    base = base[:-drop]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.add(prefix)
            names.update(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that `name` is, or lies inside."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between project modules, raw imported names per module)."""
    modules = _modules()
    edges: dict[str, set[str]] = {}
    raw: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = _imported_names(module, path)
        raw[module] = names
        targets = {_resolve(name, modules) for name in names}
        edges[module] = {t for t in targets if t is not None and t != module}
    return edges, raw


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _violations(raw: dict[str, set[str]], layer: str, forbidden: set[str]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module, names in raw.items()
        if _top(module) == layer
        for name in names
        if _top(name) in forbidden
    )


def test_module_graph_is_acyclic() -> None:
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"  {len(c)} modules: {' <-> '.join(c)}" for c in cycles
    )


def test_trainer_never_imports_gateway() -> None:
    _, raw = _graph()
    bad = _violations(raw, "trainer", {"rlgate", "gateway"})
    assert not bad, "\n".join(bad)


def test_engine_never_imports_gateway_or_trainer() -> None:
    _, raw = _graph()
    bad = _violations(raw, "engine", {"rlgate", "gateway", "trainer"})
    assert not bad, "\n".join(bad)


def test_core_imports_no_upper_layer() -> None:
    _, raw = _graph()
    bad = _violations(raw, "core", {"rlgate", "gateway", "trainer", "engine"})
    assert not bad, "\n".join(bad)


def test_schemas_imports_no_upper_layer() -> None:
    """The data contract is the very bottom: core uses its tables, never the reverse."""
    _, raw = _graph()
    bad = _violations(raw, "schemas", {"rlgate", "core", "gateway", "trainer", "engine"})
    assert not bad, "\n".join(bad)


def test_gateway_enters_trainer_only_through_api() -> None:
    """The gateway reaches the trainer through trainer.api only (the command line that
    registers the trainer's commands is in rlgate/, above both)."""
    _, raw = _graph()
    door = {"trainer", "trainer.api"}
    bad = sorted(
        f"{module} imports {name}"
        for module, names in raw.items()
        if _top(module) == "gateway"
        for name in names
        if _top(name) == "trainer" and name not in door and not name.startswith("trainer.api.")
    )
    assert not bad, "\n".join(bad)


def test_rlgate_is_the_top_layer() -> None:
    """The product's commands import every layer; no layer imports them."""
    _, raw = _graph()
    below = {"core", "schemas", "engine", "trainer", "gateway"}
    bad = sorted(
        f"{module} imports {name}"
        for module, names in raw.items()
        if _top(module) in below
        for name in names
        if _top(name) == "rlgate"
    )
    assert not bad, "\n".join(bad)


# gateway/'s own layers, bottom up (gateway/__init__.py, docs/architecture.md). A module
# imports from its own unit and from lower ranks only; units that share a rank (engines
# and recording) never import each other. Every gateway module belongs to one unit, so a
# new module at gateway/'s top level fails here until it is placed.
GATEWAY_LAYERS: tuple[tuple[str, ...], ...] = (
    ("gateway.edge",),
    ("gateway.engines", "gateway.recording"),
    ("gateway.call",),
    ("gateway.state",),
    ("gateway.routes",),
    ("gateway.api",),
    ("gateway.admin",),
    ("gateway.app",),
)


def _gateway_unit(module: str) -> tuple[int, str] | None:
    """(rank, unit) of a gateway module; None for the package itself or a module outside."""
    for rank, units in enumerate(GATEWAY_LAYERS):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return rank, unit
    return None


def _gateway_layer_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in edges.items():
        if _top(module) != "gateway" or module == "gateway":
            continue
        here = _gateway_unit(module)
        if here is None:
            bad.append(f"{module} is in no layer of GATEWAY_LAYERS")
            continue
        for target in sorted(targets):
            there = _gateway_unit(target)
            if there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                bad.append(f"{module} ({here[1]}) imports {target} ({there[1]})")
    return sorted(bad)


def test_gateway_subpackages_are_layered() -> None:
    edges, _ = _graph()
    bad = _gateway_layer_violations(edges)
    assert not bad, "\n".join(bad)


def test_gateway_layer_check_catches_violations() -> None:
    """The check above fails on an upward import, one between units of a rank, and a
    module placed in no layer."""
    edges = {
        "gateway.edge.errors": {"gateway.routes.waits"},
        "gateway.engines.unloads": {"gateway.recording.spool"},
        "gateway.call.pipeline": {"gateway.app"},
        "gateway.loose": set(),
        "gateway.routes.waits": {"gateway.call.pipeline", "gateway.state", "gateway.edge"},
    }
    assert _gateway_layer_violations(edges) == [
        "gateway.call.pipeline (gateway.call) imports gateway.app (gateway.app)",
        "gateway.edge.errors (gateway.edge) imports gateway.routes.waits (gateway.routes)",
        "gateway.engines.unloads (gateway.engines) imports gateway.recording.spool"
        " (gateway.recording)",
        "gateway.loose is in no layer of GATEWAY_LAYERS",
    ]


def test_commands_live_in_rlgate() -> None:
    """gateway/ holds only the gateway: the command line, up, demo and export are in rlgate/."""
    modules = _modules()
    assert {"rlgate.cli", "rlgate.up", "rlgate.demo", "rlgate.export"} <= set(modules)
    moved = {"gateway.cli", "gateway.up", "gateway.demo", "gateway.export", "gateway.migrate"}
    assert not moved & set(modules)


def test_core_package_exists() -> None:
    modules = _modules()
    assert {"core.settings", "core.db", "core.keys"} <= set(modules)


def test_tests_mirror_the_packages() -> None:
    """A test module lives in the folder of the package it tests (tests/core, tests/trainer,
    tests/rlgate, ...); only this whole-project check sits at tests/ root."""
    root_tests = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert root_tests == ["test_imports.py"], root_tests
    for package in PACKAGES:
        assert (ROOT / "tests" / package / "__init__.py").is_file(), f"tests/{package}/ missing"


def _module_level_imports(path: Path) -> set[str]:
    """Names imported when the module is loaded: its top-level statements, not function
    bodies, and not under ``if TYPE_CHECKING:``."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                todo.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + node.finalbody)
    return names


def test_opentelemetry_is_loaded_only_for_traces() -> None:
    """OpenTelemetry is an optional extra (rlgate[otel]): only gateway/call/tracing.py imports
    it, and no module loads gateway/call/tracing.py with itself (gateway/app.py imports it in
    ``build_tracing``, when RLGATE_OTLP_ENDPOINT is set)."""
    modules = _modules()
    _, raw = _graph()
    bad = sorted(
        f"{module} imports {name}"
        for module, names in raw.items()
        if module != "gateway.call.tracing"
        for name in names
        if _top(name) == "opentelemetry"
    )
    assert not bad, "\n".join(bad)
    loads = sorted(
        module
        for module, path in modules.items()
        if module != "gateway.call.tracing"
        and "gateway.call.tracing" in _module_level_imports(path)
    )
    assert not loads, f"modules that load gateway.call.tracing with themselves: {loads}"
