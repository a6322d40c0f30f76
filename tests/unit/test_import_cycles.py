"""No import cycle between Kiln's modules, counting imports inside functions: a cycle hidden in a function
body still ties two modules together (``tuner.timing.side_by_side`` and ``tuner.timing.profile_runs`` once did)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("forkserver", "kiln_tvm", "schedules", "tuner", "service", "cli")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_names(tree: ast.Module, package: str) -> set[str]:
    """Every dotted name an ``import`` or ``from ... import`` anywhere in ``tree`` may load."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Each Kiln module and the Kiln modules it imports (a name resolves to its longest module prefix)."""
    files = {_module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        imported = {resolve(name) for name in _imported_names(ast.parse(path.read_text()), package)}
        graph[module] = {m for m in imported if m is not None and m != module}
    return graph


def test_kilns_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph()
    assert {"tuner.jobs.pipeline", "service.app", "kiln_tvm"} <= graph.keys()
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


def test_the_check_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    package = tmp_path / "tuner"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "timing.py").write_text("from tuner.runs import kernel_calls\n")
    (package / "runs.py").write_text("def kernel_calls():\n    from .timing import median\n")
    graph = import_graph(tmp_path)
    assert graph["tuner.timing"] == {"tuner.runs"} and graph["tuner.runs"] == {"tuner.timing"}
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()
