"""Kiln's functions take at most :data:`MAX_POSITIONAL` positional parameters; the rest are keyword-only,
so that a call reads what it passes (``plan_graph(mod, target, options)``, not a row of bare booleans).

A signature a framework declares is exempt: a CLI command's options (typer) and an HTTP route's query and
form parameters (FastAPI) are named by their users, not by position."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("forkserver", "kiln_tvm", "schedules", "tuner", "service", "cli")
MAX_POSITIONAL = 5
#: Decorators whose function's parameters a framework fills by name: typer's ``@app.command()`` and
#: ``@app.callback()``, FastAPI's ``@router.get(...)`` and the other methods.
FRAMEWORK_DECORATORS = {"command", "callback", "get", "post", "put", "patch", "delete"}


def _declared_by_a_framework(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        call = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(call, ast.Attribute) and call.attr in FRAMEWORK_DECORATORS:
            return True
    return False


def long_positional_signatures(source: str) -> list[tuple[str, int, int]]:
    """``(name, line, positional parameters)`` of each function in ``source`` with more than
    :data:`MAX_POSITIONAL` positional parameters (``self`` and ``cls`` not counted)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _declared_by_a_framework(node):
            continue
        positional = [a for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
        if len(positional) > MAX_POSITIONAL:
            found.append((node.name, node.lineno, len(positional)))
    return found


def test_no_function_of_kiln_takes_more_than_a_few_positional_parameters() -> None:
    long = [
        f"{path.relative_to(REPO)}:{line} {name} ({count} positional)"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for name, line, count in long_positional_signatures(path.read_text())
    ]
    assert not long, "make the trailing parameters keyword-only:\n" + "\n".join(long)


def test_the_check_counts_positional_parameters_and_exempts_framework_signatures() -> None:
    source = """
def six(a, b, c, d, e, f): ...
def five_then_keywords(a, b, c, d, e, *, f, g): ...
class C:
    def method(self, a, b, c, d, e, f=1): ...
@app.command()
def cli_command(a, b, c, d, e, f): ...
@router.get("/x")
async def route(a, b, c, d, e, f): ...
"""
    assert [(name, count) for name, _, count in long_positional_signatures(source)] == [
        ("six", 6),
        ("method", 6),
    ]
