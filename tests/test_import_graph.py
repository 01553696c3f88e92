"""The import graph of shared/ and services/ (every module's imports, read from its source,
function-level ones included, `if TYPE_CHECKING:` blocks left out as they never run): no
circle anywhere, nothing in shared/ imports services/, no shared package imports one above
it in LAYERS, and no service imports another service (only the command layer composes
them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# shared/'s packages, lowest first: a package may import its own layer's and lower ones'.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"", "config", "errors", "backoff", "logs", "tracing", "liveness"}),
    frozenset({"settings"}),
    frozenset({"redis", "storage", "images"}),
    frozenset({"engine"}),
    frozenset({"tenants", "webhooks", "client", "vendor"}),
    frozenset({"maintenance", "testing"}),
)
# services/'s packages that are services: each stands alone on shared/.
SERVICES = frozenset(
    {"gateway", "gpu_worker", "webhook_dispatcher", "dlq_redriver", "quota_settler"}
)


def _modules() -> dict[str, Path]:
    found = {}
    for base in ("shared", "services"):
        for path in (ROOT / base).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["splatq." + ".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            if target.startswith("splatq.") and (hit := _resolve(target)) and hit != module:
                out.add(hit)
    return out


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root, children_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(children_of_root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _shared_package(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def _layer(package: str) -> int:
    for number, members in enumerate(LAYERS):
        if package in members:
            return number
    raise AssertionError(f"shared/{package} is in no layer: add it to LAYERS")


def test_the_graph_is_read() -> None:
    # A walker that found nothing would pass every rule below.
    assert len(MODULES) > 150
    assert "splatq.shared.engine.producers" in GRAPH["splatq.services.gateway.admission"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert _cycles(GRAPH) == []


def test_shared_never_imports_services() -> None:
    upward = sorted(
        (module, target)
        for module, targets in GRAPH.items()
        if module.startswith("splatq.shared")
        for target in targets
        if target.startswith("splatq.services")
    )
    assert upward == []


@pytest.mark.parametrize(
    "package", sorted({_shared_package(m) for m in MODULES if m.startswith("splatq.shared")})
)
def test_shared_layers_import_downwards(package: str) -> None:
    own = _layer(package)
    upward = sorted(
        (module, target)
        for module, targets in GRAPH.items()
        if module.startswith("splatq.shared") and _shared_package(module) == package
        for target in targets
        if target.startswith("splatq.shared") and _layer(_shared_package(target)) > own
    )
    assert upward == []


def test_no_service_imports_another() -> None:
    def service(module: str) -> str | None:
        parts = module.split(".")
        if parts[1] == "services" and len(parts) > 2 and parts[2] in SERVICES:
            return parts[2]
        return None

    crossing = sorted(
        (module, target)
        for module, targets in GRAPH.items()
        if service(module)
        for target in targets
        if service(target) and service(target) != service(module)
    )
    assert crossing == []
