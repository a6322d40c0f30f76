"""Targets: detect this CPU, parse user-given targets, and key records by a canonical target."""

from __future__ import annotations

import json
from typing import Any

from schedules._tvm import Target, physical_core_count, tvm
from tuner.errors import InvalidTarget

SUPPORTED_KINDS = ("llvm", "cuda")
# Attributes that change which schedule is best; a record is only reused when they all agree.
_KEY_ATTRS = ("kind", "mtriple", "mcpu", "mattr", "num-cores", "arch", "max_num_threads")


def host_target() -> dict[str, Any]:
    """The CPU this process runs on: LLVM's name for it and its physical core count."""
    return {
        "kind": "llvm",
        "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        "num-cores": physical_core_count(),
    }


def resolve_target(spec: str | dict[str, Any]) -> dict[str, Any]:
    """Turn ``"host"``, a JSON object text or a dict into a validated TVM target dict.

    LLVM targets get ``num-cores`` (MetaSchedule requires it) and an ``mcpu`` LLVM knows.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text == "host":
            return host_target()
        if text == "llvm":
            return {"kind": "llvm", "num-cores": physical_core_count()}
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidTarget(
                f"target {spec!r} is neither 'host' nor a JSON object such as "
                '\'{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}\''
            ) from exc
        spec = parsed
    if not isinstance(spec, dict):
        raise InvalidTarget(f"target must be 'host' or a JSON object, got {type(spec).__name__}")
    target = dict(spec)
    kind = target.get("kind")
    if kind not in SUPPORTED_KINDS:
        raise InvalidTarget(f"target kind {kind!r} is not supported; use one of {', '.join(SUPPORTED_KINDS)}")
    if kind == "llvm":
        target.setdefault("num-cores", physical_core_count())
        if not isinstance(target["num-cores"], int) or target["num-cores"] < 1:
            raise InvalidTarget(f"target 'num-cores' must be a positive integer, got {target['num-cores']!r}")
    try:
        tvm_target = Target(target)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InvalidTarget(f"invalid target {json.dumps(spec)}: {exc}") from exc
    if kind == "llvm" and "mcpu" in target:
        triple = target.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
        if not tvm.target.codegen.llvm_is_valid_cpu(target["mcpu"], triple):
            raise InvalidTarget(f"LLVM does not know the CPU {target['mcpu']!r} (target {json.dumps(spec)})")
    del tvm_target
    return target


def to_tvm_target(target: dict[str, Any]) -> Target:
    """A TVM ``Target`` for a resolved target dict."""
    return Target(target)


def canonical_target_key(target: dict[str, Any]) -> str:
    """A stable text key of the attributes that decide which schedule is valid and fast.

    Example: ``llvm -mcpu=znver3 -num-cores=2``.
    """
    exported = dict(Target(target).export())
    parts = [str(exported["kind"])]
    for attr in _KEY_ATTRS[1:]:
        value = exported.get(attr)
        if value in (None, "", [], ()):
            continue
        if isinstance(value, list | tuple):
            value = ",".join(sorted(str(v) for v in value))
        parts.append(f"-{attr}={value}")
    return " ".join(parts)


def is_host_cpu(target: dict[str, Any]) -> bool:
    """True when code for ``target`` can run on this machine (so it can be measured and verified here)."""
    if target.get("kind") != "llvm":
        return False
    mcpu = target.get("mcpu")
    return mcpu is None or mcpu == tvm.target.codegen.llvm_get_system_cpu()
