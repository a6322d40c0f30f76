"""The README and every page of docs/ say only what the code does: each `kiln` command they show exists with
the options they give it, each `KILN_*` variable is a setting, each API route is served, and each relative
link leads to a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Variables the project's own tooling reads (Makefile, CI, tests), not the service's settings.
NOT_SETTINGS = {"KILN_RUN_TRIALS", "KILN_TEST_DATABASE_URL", "KILN_REQUIRE_BROWSER", "KILN_TEST_REQUIRE"}


def _commands() -> dict[str, click.Command]:
    """Every command of the CLI by its full name ("tune", "db upgrade", ...)."""
    from cli.main import app

    root = typer.main.get_command(app)
    found: dict[str, click.Command] = {}

    def walk(command: click.Command, prefix: str) -> None:
        if hasattr(command, "commands"):  # a group (typer's own click classes)
            for name, sub in command.commands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            found[prefix] = command

    walk(root, "")
    return found


def _options(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def _code_spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return inline + [line for block in blocks for line in block.splitlines()]


def _kiln_invocations(page: Path) -> list[str]:
    return [
        span[span.index("kiln ") :]
        for span in _code_spans(page.read_text())
        if re.search(r"(^|[\s/])kiln \w", span) and "pip install" not in span
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_kiln_command_and_option_a_page_shows_exists(page: Path) -> None:
    commands = _commands()
    shown = _kiln_invocations(page)
    for invocation in shown:
        words = invocation.split()[1:]
        if words[0] == "COMMAND":  # `kiln COMMAND --help`: any command's help
            continue
        name = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
        assert name in commands, (
            f"{page.name}: `{invocation}` names no command (there are {sorted(commands)})"
        )
        flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", invocation))
        unknown = flags - _options(commands[name]) - {"--help"}
        assert not unknown, f"{page.name}: `kiln {name}` has no option {sorted(unknown)}"


def test_the_readme_shows_the_main_commands() -> None:
    shown = {" ".join(i.split()[1:2]) for i in _kiln_invocations(ROOT / "README.md")}
    assert {"tune", "tasks", "serve", "submit", "worker", "status", "export", "machine"} <= shown


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_kiln_variable_a_page_names_is_a_setting(page: Path) -> None:
    from tuner.settings import Settings

    settings = {f"KILN_{name.upper()}" for name in Settings.model_fields}
    named = set(re.findall(r"\bKILN_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
    unknown = named - settings - NOT_SETTINGS
    assert not unknown, f"{page.name} names variables that are no setting: {sorted(unknown)}"


def _routes() -> set[tuple[str, str]]:
    from service.app import create_app
    from tuner.settings import Settings

    app = create_app(Settings(data_dir=Path("/nonexistent-kiln-docs-test"), database_url="sqlite://"))
    return {
        (method.upper(), re.sub(r"\{[^}]+\}", "{}", path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_api_route_a_page_names_is_served(page: Path) -> None:
    served = _routes()
    named = re.findall(r"\b(GET|POST|PUT|PATCH|DELETE) (/[\w/{}.-]*)", page.read_text())
    for method, path in named:
        normal = re.sub(r"\{[^}]+\}", "{}", path.rstrip("."))
        assert (method, normal) in served, f"{page.name}: {method} {path} is not a route"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_of_a_page_leads_to_a_file(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"
