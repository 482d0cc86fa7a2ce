"""Package boundaries: core imports no engine, LLM or CLI module (those are found through entry points),
and core's own modules import each other without cycles. Read from the sources, so it holds for code
paths no other test runs."""

from __future__ import annotations

import ast
from pathlib import Path

import torchburn

CORE = Path(torchburn.__file__).parent
OTHER_PACKAGES = ("torchburn_native", "torchburn_wgpu", "torchburn_llm", "torchburn_cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, module_level_only: bool) -> set[str]:
    """Modules ``path`` imports (relative imports resolved), optionally only those at module level
    outside ``if TYPE_CHECKING:`` blocks (the ones that run when the module is imported)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base]) if base else ".".join(parent)
                # ``from package import module`` needs the module; ``from module import name`` the module
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif not module_level_only or isinstance(node, (ast.If, ast.Try)):
                children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
                visit(children)

    visit(tree.body)
    return found


def _core_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in CORE.rglob("*.py")}


MODULES = _core_modules()


def test_core_imports_no_engine_llm_or_cli() -> None:
    offenders = []
    for name, path in _core_modules().items():
        for imported in _imports(path, module_level_only=False):
            if imported.split(".")[0] in OTHER_PACKAGES:
                offenders.append(f"{name} imports {imported}")
    assert not offenders, "\n".join(offenders)


def test_core_modules_import_each_other_without_cycles() -> None:
    modules = _core_modules()
    graph = {
        name: {m for m in _imports(path, module_level_only=True) if m in modules and m != name}
        for name, path in modules.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
