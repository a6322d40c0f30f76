"""Every child process Kiln forks comes from a fork server started as ``python -m MODULE --fork-server FD``,
and every such MODULE follows one pattern: ``warm_up`` (what the server loads once), ``serve_one`` (one
forked child's work) and ``main`` (``forkserver.serve_main`` with both)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("tuner", "kiln_tvm", "service", "cli")


def fork_server_modules() -> set[str]:
    """The modules named by a ``shared_fork_server("...")`` call anywhere in Kiln's packages."""
    named = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            named.update(re.findall(r'shared_fork_server\(\s*"([\w.]+)"', path.read_text()))
    return named


def test_the_fork_servers_are_the_known_child_modules() -> None:
    assert fork_server_modules() == {
        "tuner.isolation.sandbox_child",
        "tuner.jobs.worker_child",
        "tuner.timing.timing_child",
        "kiln_tvm.popen_workers",
    }


@pytest.mark.parametrize("module", sorted(fork_server_modules()))
def test_each_child_module_follows_the_one_pattern(module: str) -> None:
    loaded = importlib.import_module(module)
    assert callable(loaded.warm_up) and callable(loaded.serve_one) and callable(loaded.main)
    source = Path(loaded.__file__).read_text()
    tree = ast.parse(source)
    serve_main = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "serve_main"
    ]
    assert len(serve_main) == 1, "main() starts the server through forkserver.serve_main"
    name, warm_up, serve_one = serve_main[0].args[:3]
    assert (name.value, warm_up.id, serve_one.id) == (module, "warm_up", "serve_one")
    assert 'if __name__ == "__main__":\n    main()' in source
