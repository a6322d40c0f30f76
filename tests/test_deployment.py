"""The fleet's deployment files (Dockerfile, docker-compose.yml, .dockerignore), checked by parsing them.

No Docker engine runs here: these tests read the files and hold them against the code they deploy (the
fields of :class:`tuner.settings.Settings`, the ``kiln`` command tree), so that renaming a setting or a
command breaks a test instead of a fleet.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer.main
import yaml

import cli.main
from tuner.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# What an operator exports before `docker compose up`: the values the compose file is interpolated with.
HOST_ENV = {"KILN_API_TOKENS": "admin:s3cret"}

# Each Kiln service and the `kiln` subcommand it must run.
KILN_COMMANDS = {
    "migrate": ("db", "upgrade"),
    "api": ("serve",),
    "worker": ("worker",),
    "tracker": ("rpc", "tracker"),
    "rpc-server": ("rpc", "server"),
}
POSTGRES = "postgres"
# Services that must all use the one PostgreSQL database (otherwise each would fall back to its own SQLite).
DATABASE_SERVICES = ("migrate", "api", "worker")
# Services that must see the same data directory (uploaded models in, artifacts out).
DATA_SERVICES = ("api", "worker")
ENV_PREFIX = "KILN_"


# --- compose interpolation (${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, ${VAR:+alt}, $$)


class MissingVariable(Exception):
    """A ``${VAR:?message}`` whose variable is not set."""


_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>\w+))")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Substitute variables in one string the way ``docker compose`` does."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op = match.group("op") or ""
        arg = match.group("arg") or ""
        is_set = name in env and (not op.startswith(":") or env[name] != "")
        if op.endswith("-"):
            return env[name] if is_set else arg
        if op.endswith("?"):
            if not is_set:
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        if op.endswith("+"):
            return arg if is_set else ""
        return env.get(name, "")

    return _VARIABLE.sub(substitute, value)


def _interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: _interpolate_tree(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(value, env) for value in node]
    return node


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml with its anchors merged and its variables substituted from ``env``."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return _interpolate_tree(raw, HOST_ENV if env is None else env)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# --- reading one service


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as strings (mapping or ``KEY=VALUE`` list form)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    result = {}
    for key, value in env.items():
        # Compose rejects booleans here; a bare key takes the value from the operator's shell.
        assert not isinstance(value, bool), f"{key}: quote booleans in a compose environment"
        result[key] = HOST_ENV.get(key, "") if value is None else str(value)
    return result


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(arg) for arg in cmd]


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in an argument list."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def volumes(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume, short (``src:dst[:ro]``) or long form."""
    result = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            result.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            result.append((volume.get("source", ""), volume["target"], bool(volume.get("read_only"))))
    return result


def container_ports(service: dict[str, Any]) -> set[int]:
    """Container-side ports that a service publishes on the host."""
    result = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            result.add(int(port["target"]))
        else:
            result.add(int(str(port).split(":")[-1].split("/")[0]))
    return result


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Dependency -> condition (the short list form means ``service_started``)."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def settings_of(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings a Kiln process in this service would read from its environment."""
    for key in list(os.environ):
        if key.upper().startswith(ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in environment(service).items():
        monkeypatch.setenv(key, value)
    return Settings()


def field_of(env_name: str) -> str:
    return env_name[len(ENV_PREFIX) :].lower()


# --- reading the Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


def dockerfile(keyword: str) -> list[str]:
    return [args for kw, args in dockerfile_instructions() if kw == keyword]


# --- the compose file


def test_required_services_exist(services: dict[str, dict[str, Any]]) -> None:
    missing = {POSTGRES, *KILN_COMMANDS} - set(services)
    assert not missing, f"docker-compose.yml lacks services {sorted(missing)}"


def test_kiln_services_run_one_image_built_from_the_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    images = {services[name].get("image") for name in KILN_COMMANDS if name in services}
    # Any other service built here or running that image is a Kiln service too.
    kiln = [
        name
        for name, s in services.items()
        if name in KILN_COMMANDS or "build" in s or s.get("image") in images
    ]
    assert POSTGRES not in kiln
    for name in kiln:
        build = services[name].get("build")
        assert build is not None, f"{name}: runs kiln, so it must build the image from the Dockerfile"
        if isinstance(build, str):
            build = {"context": build}
        assert (COMPOSE_FILE.parent / build.get("context", ".")).resolve() == ROOT, name
        assert (ROOT / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE, name
    assert len({services[name].get("image") for name in kiln}) == 1, "Kiln services must share one image tag"
    assert None not in images, "give the Kiln image a tag, so that every service reuses it"


def test_every_kiln_variable_is_a_setting(services: dict[str, dict[str, Any]]) -> None:
    # Anywhere in the file (environment keys, interpolated variables, comments): Settings ignores unknown
    # KILN_* variables, so a typo would otherwise be silently dropped.
    names = set(re.findall(r"\b" + ENV_PREFIX + r"[A-Za-z0-9_]+\b", COMPOSE_FILE.read_text()))
    for service in services.values():
        names |= {key for key in environment(service) if key.upper().startswith(ENV_PREFIX)}
    assert names, "the compose file sets no KILN_* variable"
    unknown = sorted(name for name in names if field_of(name) not in Settings.model_fields)
    assert not unknown, f"not fields of tuner.settings.Settings: {unknown}"


@pytest.mark.parametrize("name", DATABASE_SERVICES)
def test_service_environment_is_valid_settings(
    name: str, services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = services[name]
    settings = settings_of(service, monkeypatch)  # raises pydantic's ValidationError on a bad value
    # Every KILN_* variable the service sets reaches its field, and the database is the compose file's.
    set_here = {field_of(key) for key in environment(service) if key.upper().startswith(ENV_PREFIX)}
    assert set_here and set_here <= settings.model_fields_set, set_here - settings.model_fields_set
    assert settings.database_url == environment(service)["KILN_DATABASE_URL"]
    assert settings.database_url.startswith("postgresql")


def test_api_tokens_must_come_from_the_operator(services: dict[str, dict[str, Any]]) -> None:
    with pytest.raises(MissingVariable, match="KILN_API_TOKENS"):
        load_compose(env={})
    assert environment(services["api"])["KILN_API_TOKENS"] == HOST_ENV["KILN_API_TOKENS"]


@pytest.mark.parametrize(
    "host_env", [{}, {"POSTGRES_PASSWORD": "not-the-default"}], ids=["default", "override"]
)
def test_database_url_matches_the_postgres_service(host_env: dict[str, str]) -> None:
    services = load_compose(env={**HOST_ENV, **host_env})["services"]
    postgres = services[POSTGRES]
    assert str(postgres["image"]).startswith("postgres:")
    pg_env = environment(postgres)
    urls = set()
    for name in DATABASE_SERVICES:
        raw = environment(services[name]).get("KILN_DATABASE_URL")
        assert raw, f"{name}: without KILN_DATABASE_URL it would use its own SQLite file"
        urls.add(raw)
        url = sa.make_url(raw)
        assert url.drivername == "postgresql+psycopg", f"{name}: {url.drivername}"
        assert url.host == POSTGRES, f"{name}: database host {url.host!r} is not the postgres service"
        assert (url.port or 5432) == 5432
        assert url.username == pg_env["POSTGRES_USER"]
        assert url.password == pg_env["POSTGRES_PASSWORD"]
        assert url.database == pg_env["POSTGRES_DB"]
    assert len(urls) == 1, f"services disagree on the database: {urls}"


def test_postgres_is_healthchecked_and_keeps_its_data(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    postgres = services[POSTGRES]
    assert "pg_isready" in json.dumps(postgres["healthcheck"]["test"])
    sources = {source for source, target, _ in volumes(postgres) if target == "/var/lib/postgresql/data"}
    assert sources and sources <= set(compose.get("volumes") or {}), "PostgreSQL's data needs a named volume"


def test_api_and_workers_share_the_data_volume(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = set()
    for name in DATA_SERVICES:
        data_dir = settings_of(services[name], monkeypatch).data_dir
        assert data_dir.is_absolute(), (
            f"{name}: KILN_DATA_DIR={data_dir} is relative to the working directory"
        )
        mounts = [(source, ro) for source, target, ro in volumes(services[name]) if Path(target) == data_dir]
        assert mounts, f"{name}: no volume mounted at KILN_DATA_DIR={data_dir}"
        ((source, read_only),) = mounts
        assert not read_only, f"{name}: the data volume must be writable"
        sources.add(source)
    assert len(sources) == 1, f"api and workers mount different data volumes: {sources}"
    assert sources <= set(compose.get("volumes") or {}), "the data volume should be a named volume"


def test_api_runs_no_embedded_workers(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings_of(services["api"], monkeypatch).embedded_workers == 0


def test_worker_can_be_scaled(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker, "a fixed container_name prevents --scale worker=N"
    assert not worker.get("ports"), "host ports on a worker collide when it is scaled"


def test_kiln_services_wait_for_postgres_and_migrations(services: dict[str, dict[str, Any]]) -> None:
    assert depends_on(services["migrate"]).get(POSTGRES) == "service_healthy"
    assert services["migrate"].get("restart", "no") == "no", "migrate is a one-shot service"
    for name in ("api", "worker"):
        deps = depends_on(services[name])
        assert deps.get(POSTGRES) == "service_healthy", name
        assert deps.get("migrate") == "service_completed_successfully", name
    for name, service in services.items():
        unknown = set(depends_on(service)) - set(services)
        assert not unknown, f"{name} depends on unknown services {unknown}"


def test_only_the_api_keeps_the_http_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    assert not (services["api"].get("healthcheck") or {}).get("disable")
    for name in set(KILN_COMMANDS) - {"api"}:
        healthcheck = services[name].get("healthcheck") or {}
        assert healthcheck.get("disable") is True, (
            f"{name}: serves no /healthz, disable the image's HEALTHCHECK"
        )


@pytest.mark.parametrize("name", list(KILN_COMMANDS))
def test_service_command_is_a_real_kiln_command(name: str, services: dict[str, dict[str, Any]]) -> None:
    argv = command(services[name])
    expected = KILN_COMMANDS[name]
    assert tuple(argv[: len(expected)]) == expected, f"{name} should run `kiln {' '.join(expected)}`: {argv}"
    # Duck-typed: typer >= 0.26 builds its tree from a vendored copy of click, not the `click` package.
    node: Any = typer.main.get_command(cli.main.app)
    path = ["kiln"]
    for word in expected:
        subcommands = getattr(node, "commands", None)
        assert subcommands is not None, f"`{' '.join(path)}` has no subcommands"
        assert word in subcommands, (
            f"`{' '.join(path)}` has no subcommand {word!r} (has {sorted(subcommands)})"
        )
        node = subcommands[word]
        path.append(word)
    # Parses the service's options against the command's: unknown options or bad values fail here.
    try:
        node.make_context(" ".join(path), argv[len(expected) :])
    except Exception as exc:  # click's UsageError/BadParameter, from whichever click typer uses
        message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
        pytest.fail(f"{name}: `kiln {' '.join(argv)}`: {message}")


def test_api_listens_on_all_interfaces_on_its_published_port(services: dict[str, dict[str, Any]]) -> None:
    argv = command(services["api"])
    assert option(argv, "--host") == "0.0.0.0", "inside a container, 127.0.0.1 is unreachable from outside"
    port = int(option(argv, "--port") or Settings.model_fields["port"].default)
    assert port in container_ports(services["api"])
    exposed = {int(p.split("/")[0]) for args in dockerfile("EXPOSE") for p in args.split()}
    assert port in exposed, f"the Dockerfile does not EXPOSE the API port {port}"


def test_rpc_server_registers_with_the_tracker_service(services: dict[str, dict[str, Any]]) -> None:
    tracker_argv = command(services["tracker"])
    assert option(tracker_argv, "--host") == "0.0.0.0"
    tracker_port = option(tracker_argv, "--port")
    address = option(command(services["rpc-server"]), "--tracker")
    assert address is not None, "rpc-server needs --tracker"
    host, _, port = address.rpartition(":")
    assert host == "tracker" and port == tracker_port, f"--tracker {address} is not tracker:{tracker_port}"
    assert option(command(services["rpc-server"]), "--key"), "rpc-server needs a device --key"
    for name in DATABASE_SERVICES:
        value = environment(services[name]).get("KILN_RPC_TRACKER")
        assert value in (None, address), f"{name}: KILN_RPC_TRACKER={value}, the tracker is {address}"
    assert environment(services["api"]).get("KILN_RPC_TRACKER") == address


# --- the Dockerfile and .dockerignore


def test_dockerfile_installs_kiln_and_runs_it_as_a_user() -> None:
    (base,) = dockerfile("FROM")
    match = re.fullmatch(r"python:3\.(\d+)-slim(-\w+)?", base)
    assert match and int(match.group(1)) >= 10, (
        f"base image {base}: the TVM wheel needs Debian-based Python >= 3.10"
    )
    runs = dockerfile("RUN")
    assert any(re.search(r"pip install --no-cache-dir \.(\s|$)", run) for run in runs), (
        "pip install . missing"
    )
    assert any("g++" in run for run in runs), "TVM links exported libraries with g++"
    assert json.loads(dockerfile("ENTRYPOINT")[-1]) == ["kiln"]
    users = dockerfile("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must not run as root"
    (healthcheck,) = dockerfile("HEALTHCHECK")
    assert "/healthz" in healthcheck and "urllib" in healthcheck


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    patterns = [
        line.strip().removeprefix("/").removeprefix("**/").rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for required in (".venv", "kiln-data", ".git"):
        assert required in patterns, f".dockerignore should exclude {required}"
    for needed in ("pyproject.toml", "README.md", "tuner", "service", "schedules"):
        excluded = [p for p in patterns if fnmatch.fnmatch(needed, p)]
        assert not excluded, f"{needed} is needed by `pip install .` but excluded by {excluded}"
