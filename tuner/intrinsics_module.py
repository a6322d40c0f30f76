"""The module an artifact ships so that plain TVM can read its records: Kiln's tensor intrinsics.

A record tensorized with one of Kiln's intrinsics (``kiln_dot_16x4_vnni``, ``kiln_dot_16x2_avx512bf16``,
``kiln_amx_...``) names it in its trace; MetaSchedule's ``JSONDatabase`` replays the trace when it reads the
record, and fails with "TensorIntrin ... is not registered" in a process that has not registered it. The
artifact therefore carries ``kiln_intrinsics/``: the modules of :mod:`kiln_tvm` that define them (they import
TVM and the standard library only) and an ``__init__`` that registers the ones its records use. A user
imports it, with plain TVM, before opening the records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import kiln_tvm
from kiln_tvm.x86_amx import AMX_NAME_PREFIX
from kiln_tvm.x86_bf16 import DPBF16_INTRINSIC
from kiln_tvm.x86_vnni import (
    AVX2_BYTE_INTRINSIC,
    AVX2_WORD_INTRINSIC,
    AVX512_BYTE_INTRINSIC,
    AVX512_WORD_INTRINSIC,
    AVXVNNI_INTRINSIC,
    VNNI_INTRINSIC,
)

PACKAGE = "kiln_intrinsics"
#: Kiln's intrinsic names, as they appear (quoted) in a trace.
_KILN_NAME = re.compile(r'"(kiln_[a-z0-9_]+)"')
#: Which module of kiln_tvm registers which names (a name ending in "_": every name it begins), and the
#: call that does: the names are the modules' own constants, so a rename there is a rename here.
_MODULES = (
    (
        "x86_vnni",
        "register_vnni_intrinsic",
        (
            VNNI_INTRINSIC,
            AVXVNNI_INTRINSIC,
            AVX2_WORD_INTRINSIC,
            AVX512_WORD_INTRINSIC,
            AVX2_BYTE_INTRINSIC,
            AVX512_BYTE_INTRINSIC,
        ),
    ),
    ("x86_bf16", "register_dpbf16_intrinsic", (DPBF16_INTRINSIC,)),
    ("x86_amx", "register_amx_intrinsics", (AMX_NAME_PREFIX,)),
)


def intrinsics_used(traces: Iterable[str]) -> set[str]:
    """Kiln's intrinsics the traces (JSON text) name."""
    return {name for text in traces for name in _KILN_NAME.findall(text) if _module_of(name) is not None}


def write_intrinsics_package(dest: Path, used: set[str]) -> Path | None:
    """Write ``dest/kiln_intrinsics/`` registering ``used`` (and its modules' other intrinsics); None, and
    nothing written, when ``used`` is empty."""
    modules = sorted({m for m in map(_module_of, used) if m is not None})
    if not modules:
        return None
    package = dest / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    source = Path(kiln_tvm.__file__).parent
    calls = []
    for module, register, _ in _MODULES:
        if module in modules:
            (package / f"{module}.py").write_text((source / f"{module}.py").read_text())
            calls.append((module, register))
    imports = "\n".join(f"from .{module} import {register}" for module, register in calls)
    registrations = "\n".join(f"{register}()" for _, register in calls)
    (package / "__init__.py").write_text(
        f'''"""Kiln's tensor intrinsics, for plain Apache TVM (apache-tvm==0.27.0.post1; no Kiln needed).

Import this package before reading the records in records/ with MetaSchedule: their schedules tensorize
with these intrinsics, and a trace that names an intrinsic TVM has not registered cannot be replayed.

    import kiln_intrinsics  # noqa: F401 (registers them)
    from tvm.s_tir import meta_schedule as ms
    db = ms.database.JSONDatabase("records/database_workload.json", "records/database_tuning_record.json")
"""

{imports}

#: The intrinsics the records of this artifact use.
USED = {json.dumps(sorted(used))}

{registrations}
'''
    )
    return package


def _module_of(name: str) -> str | None:
    for module, _, names in _MODULES:
        if any(name == n or (n.endswith("_") and name.startswith(n)) for n in names):
            return module
    return None
