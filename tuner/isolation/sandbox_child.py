"""The child side of :mod:`tuner.isolation.sandbox`, forked by ``python -m tuner.isolation.sandbox_child --fork-server FD``.

The fork server loads TVM and Kiln's importers once; each child it forks waits for one JSON request line
on stdin, applies the request's limits to itself, runs it, writes one JSON reply (``{"ok": ...}`` or ``{"error": {"kind", "message"}}``)
to stdout and exits. Whatever the importers print goes to stderr. The child also exits as soon as its
stdin closes: that is how it follows its parent, even one killed with SIGKILL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tuner.errors import InvalidModel, KilnError
from tuner.isolation.sandbox import data_limit_bytes, is_out_of_memory
from tuner.model_registry import BLOB_TMP_PREFIX


def op_inspect(
    *,
    path: str,
    input_shapes: dict[str, list[int]] | None,
    allow_external_data: bool,
    blob_dir: str,
    max_unpacked_mb: int,
    input_values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Import an upload to check that Kiln can use it (its ``input_values`` bound); write its canonical
    bytes to a temporary blob.

    Returns the format, sha256, size, signature and the temporary blob's path (the caller renames it
    to its sha256 name or removes it).
    """
    from tuner.frontend import load_model

    imported = load_model(
        Path(path),
        _shapes(input_shapes),
        allow_external_data=allow_external_data,
        max_unpacked_bytes=max_unpacked_mb << 20,
        input_values=input_values,
    )
    Path(blob_dir).mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=blob_dir, prefix=BLOB_TMP_PREFIX)
    os.close(fd)
    imported.write_canonical(Path(tmp))
    return {
        "format": imported.format.value,
        "sha256": imported.sha256,
        "size_bytes": Path(tmp).stat().st_size,
        "signature": imported.signature.to_dict(),
        "blob_tmp": tmp,
    }


def op_plan(
    *,
    path: str,
    input_shapes: dict[str, list[int]] | None,
    target: dict[str, Any],
    options: dict[str, Any],
    max_unpacked_mb: int,
) -> dict[str, Any]:
    """Import a stored model and run Kiln's graph passes for ``target`` with ``options``
    (:class:`~tuner.entities.PlanningOptions` as a dict): its tasks, fusion and graph."""
    from tuner.entities import PlanningOptions
    from tuner.frontend import load_model
    from tuner.targets import is_host_cpu, to_tvm_target
    from tuner.timing.precision_choice import plan_for_precision

    imported = load_model(Path(path), _shapes(input_shapes), max_unpacked_bytes=max_unpacked_mb << 20)
    plan = plan_for_precision(
        imported,
        to_tvm_target(target),
        PlanningOptions.from_dict(options),
        runs_here=is_host_cpu(target),
    )
    infos = [
        dataclasses.replace(info, polyhedral=_polyhedral(task.dispatched[0]))
        for task, info in zip(plan.tasks, plan.infos, strict=True)
    ]
    return {
        "tasks": [dataclasses.asdict(info) for info in infos],
        "fusion": dataclasses.asdict(plan.fusion),
        "graph": plan.lowered.script(),
    }


def _polyhedral(mod: Any) -> dict[str, Any]:
    """A task's polyhedral analysis as JSON (cache sizes are the caller's to add), or why it failed."""
    from schedules.poly.analysis import analyse_prim_func
    from schedules.poly.caches import UNKNOWN

    try:
        return analyse_prim_func(mod["main"], UNKNOWN).to_json()
    except Exception as exc:  # noqa: BLE001 - one kernel the analysis cannot read must not fail the plan
        return {"error": f"{type(exc).__name__}: {exc}"}


OPS = {"inspect": op_inspect, "plan": op_plan}


def _shapes(shapes: dict[str, list[int]] | None) -> dict[str, tuple[int, ...]] | None:
    return {name: tuple(dims) for name, dims in shapes.items()} if shapes else None


def _apply_limits(limits: dict[str, Any]) -> None:
    # Counted from now: loading TVM (before the request came) is not the request's memory or time.
    data = data_limit_bytes(int(limits["memory_mb"]))
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(usage.ru_utime + usage.ru_stime + float(limits["cpu_s"])) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))  # SIGXCPU at the soft limit, SIGKILL after
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


_result_fd = -1


def _write_reply(reply: dict[str, Any]) -> None:
    try:
        data = json.dumps(reply).encode()
    except MemoryError:
        data = json.dumps({"error": {"kind": "memory", "message": ""}}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(_result_fd, view) :]


def _on_cpu_limit(_signum: int, _frame: Any) -> None:
    _write_reply({"error": {"kind": "cpu_time", "message": ""}})
    os._exit(0)


def _follow_parent() -> None:
    """Exit when stdin closes: the parent is done with us, gave up, or died."""
    try:
        while sys.stdin.buffer.read(1 << 16):
            pass
    finally:
        os._exit(1)


def _reply(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"ok": OPS[request["op"]](**request["args"])}
    except KilnError as err:
        return {"error": {"kind": err.kind, "message": err.message, "details": err.details()}}
    except BaseException as err:  # noqa: BLE001 - every failure becomes a reply
        if is_out_of_memory(err):
            return {"error": {"kind": "memory", "message": ""}}
        if isinstance(err, RecursionError):
            return {
                "error": {
                    "kind": InvalidModel.kind,
                    "message": "the model nests too deeply for Kiln's importers (their recursion limit): "
                    "flatten its nested subgraphs or functions",
                }
            }
        detail = " ".join(str(err).split())[:400] or type(err).__name__
        return {
            "error": {"kind": InvalidModel.kind, "message": f"Kiln could not process this model: {detail}"}
        }


def warm_up() -> None:
    """What the fork server loads once: TVM and the importers."""
    from tuner.frontend import warm_up as load_importers

    load_importers()


def serve_one() -> None:
    """Serve one request (see the module docstring); TVM is loaded already."""
    global _result_fd
    _result_fd = os.dup(1)
    os.dup2(2, 1)  # the importers' prints must not mix with the reply
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, _on_cpu_limit)

    from tuner.isolation.fatal_signals import report_fatal_signals

    report_fatal_signals(sys.stderr)
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)
    threading.Thread(target=_follow_parent, daemon=True).start()
    request = json.loads(line)
    _apply_limits(request["limits"])
    _write_reply(_reply(request))
    os._exit(0)


def main() -> None:
    """``--fork-server FD``: load TVM once and fork a child per request (:mod:`forkserver`)."""
    from forkserver import serve_main

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_main("tuner.isolation.sandbox_child", warm_up, serve_one)


if __name__ == "__main__":
    main()
