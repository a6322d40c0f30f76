"""Targets: detect this CPU, parse user-given targets, and key records by a canonical target."""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from kiln_tvm import Target, host_cpu, physical_core_count, tvm
from tuner.errors import InvalidTarget

SUPPORTED_KINDS = ("llvm", "cuda")
#: More cores than any CPU target has: a larger ``num-cores`` is a mistake, not a machine.
MAX_NUM_CORES = 1024
# LLVM CPU features that are instruction sets (the others are scheduling hints such as "fast-gather").
# LLVM's x86 features that enable instructions (not tuning flags such as "fast-15bytenop"): a target asking
# for one this CPU lacks makes code that dies of SIGILL here, whether it asks through mcpu or mattr.
_ISA_FEATURE = re.compile(
    r"^(avx|sse|ssse|amx|fma|f16c|bmi|gfni|vaes|vpclmulqdq|sha|aes|popcnt|lzcnt|adx|movbe|xop|tbm|evex512|"
    r"egpr|ndd|ppx|push2pop2|ccmp|cf$|nf$|zu$|cmpccxadd|sm3|sm4|rdrnd|rdseed|clwb|clflushopt|movdir|"
    r"serialize|uintr|waitpkg|enqcmd|prefetchi|raoint|hreset|kl$|widekl|usermsr|pku|cx16|xsave|crc32|rtm|"
    r"fsgsbase|invpcid|prfchw|rdpid|wbnoinvd|shstk|mwaitx|clzero|lwp|3dnow|mmx|pconfig|sgx|ptwrite|tsxldtrk)"
)
_UNKNOWN_OPTION = re.compile(r"Unknown config option '([^']+)'\. Known options: ([^.]+)\.")
# Attributes that change which schedule is best; a record is only reused when they all agree.
_KEY_ATTRS = ("kind", "mtriple", "mcpu", "mattr", "num-cores", "arch", "max_num_threads")


def host_target() -> dict[str, Any]:
    """The CPU this process runs on: LLVM's name for it, the features that name misses and the CPU
    reports (``mattr``: AMX, VNNI, BF16... under a hypervisor that names an older part), and its
    physical core count."""
    target: dict[str, Any] = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}
    named = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(Target(target))}
    extra = sorted(host_cpu.llvm_features() - named)
    if extra:
        target["mattr"] = [f"+{feature}" for feature in extra]
    return {**target, "num-cores": physical_core_count()}


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
        cores = target["num-cores"]
        if type(cores) is not int or cores < 1:
            raise InvalidTarget(f"target 'num-cores' must be a positive integer, got {cores!r}")
        if cores > MAX_NUM_CORES:
            raise InvalidTarget(f"target 'num-cores' is {cores}; no CPU target has more than {MAX_NUM_CORES}")
    try:
        tvm_target = Target(target)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InvalidTarget(_target_error(spec, exc)) from None
    if kind == "llvm" and "mcpu" in target:
        triple = target.get("mtriple") or tvm.target.codegen.llvm_get_system_triple()
        if not tvm.target.codegen.llvm_is_valid_cpu(target["mcpu"], triple):
            raise InvalidTarget(f"LLVM does not know the CPU {target['mcpu']!r} (target {json.dumps(spec)})")
    del tvm_target
    return target


def _target_error(spec: Any, exc: Exception) -> str:
    """TVM's complaint about a target as one line; an unknown key is named with the keys there are."""
    text = " ".join(str(exc).split())
    unknown = _UNKNOWN_OPTION.search(text)
    if unknown:
        return (
            f"target key '{unknown.group(1)}' is not known for kind '{spec.get('kind')}'; "
            f"its keys are {unknown.group(2)}"
        )
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    return f"invalid target {json.dumps(spec)}: {last[:300]}"


def check_runs_here(target: dict[str, Any]) -> None:
    """Refuse a resolved target whose code this machine cannot run (so the local runner cannot measure it)."""
    here = tvm.target.codegen.llvm_get_system_triple().split("-")[0]
    advice = "measure it on such a device through RPC: runner {'kind': 'rpc', 'tracker': ..., 'key': ...}"
    if target.get("kind") != "llvm":
        raise InvalidTarget(
            f"the local runner measures on this machine's {here} CPU, not on a '{target.get('kind')}' "
            f"device; {advice}"
        )
    triple = target.get("mtriple")
    if triple and str(triple).split("-")[0] != here:
        raise InvalidTarget(f"target triple '{triple}' is not this machine's {here} CPU; {advice}")
    cores = int(target.get("num-cores", 1))
    if cores > (os.cpu_count() or 1):
        raise InvalidTarget(
            f"target 'num-cores' is {cores}, but this machine has {os.cpu_count()} logical CPUs for the "
            "local runner to measure on"
        )
    # Every way a target can ask for instructions (mcpu, mattr, anything else LLVM reads) ends up in the
    # features LLVM derives from the whole target: those are compared, not one attribute.
    missing = sorted(_isa_features(target) - _isa_features(host_target()))
    if missing:
        asked = ", ".join(f"{k} {target[k]!r}" for k in ("mcpu", "mattr") if target.get(k)) or "the target"
        raise InvalidTarget(
            f"{asked} asks for instructions this machine's CPU lacks ({', '.join(missing[:8])}); its code "
            f"cannot run here: use 'host', or {advice}"
        )


def _isa_features(target: dict[str, Any]) -> frozenset[str]:
    return _isa_features_of(json.dumps({k: v for k, v in target.items() if k != "num-cores"}, sort_keys=True))


# LLVM's answer holds the interpreter for milliseconds; jobs name few targets: asked once per target.
@functools.lru_cache(maxsize=256)
def _isa_features_of(target_json: str) -> frozenset[str]:
    features = tvm.target.codegen.llvm_get_cpu_features(Target(json.loads(target_json)))
    return frozenset(str(f) for f in features if _ISA_FEATURE.match(str(f)))


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
        if not isinstance(value, str) and hasattr(value, "__iter__"):  # a list, or TVM's Array of mattr
            value = ",".join(sorted(str(v) for v in value))
        parts.append(f"-{attr}={value}")
    return " ".join(parts)


def is_host_cpu(target: dict[str, Any]) -> bool:
    """True when code for ``target`` can run on this machine (so it can be measured and verified here)."""
    if target.get("kind") != "llvm":
        return False
    mcpu = target.get("mcpu")
    return mcpu is None or mcpu == tvm.target.codegen.llvm_get_system_cpu()
