"""Targets jobs were checked for on this machine, kept in the data directory.

Checking a target needs TVM, and loading TVM is most of the time a ``kiln submit`` takes: a command that
finds its target here queues the job without loading it. An entry holds for one machine (its CPU, as the
kernel reports it) and one TVM release; anything else is a miss, and the target is checked again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner.entities import JobSpec

FILE_NAME = "known-targets.json"
#: Entries kept (the most recent): a machine's jobs name few targets.
MAX_ENTRIES = 64


@dataclass(frozen=True)
class CheckedTarget:
    """What checking a job's target gives: the target resolved, the key its records are stored under, and
    the schedule space that tunes it (the one the spec names, else the target's default)."""

    target: dict[str, Any]
    key: str
    space: str

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "key": self.key, "space": self.space}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckedTarget:
        return cls(target=dict(data["target"]), key=str(data["key"]), space=str(data["space"]))


class KnownTargets:
    """The checked targets kept under ``data_dir``; a damaged or missing file is an empty one."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILE_NAME

    def get(self, spec: JobSpec) -> CheckedTarget | None:
        """The target ``spec`` asks for, as it was checked on this machine, or None."""
        entry = self._entries().get(_entry_key(spec))
        if entry is None:
            return None
        try:
            return CheckedTarget.from_dict(entry)
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, spec: JobSpec, checked: CheckedTarget) -> None:
        """Keep ``checked`` for specs asking what ``spec`` asks (written whole: readers never see half). A
        data directory that cannot be written keeps nothing: the next command checks the target again."""
        entries, key = self._entries(), _entry_key(spec)
        entries.pop(key, None)  # put back last: the most recent entries are the ones kept
        entries[key] = checked.to_dict()
        kept = dict(list(entries.items())[-MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{FILE_NAME}.")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(kept, f)
            os.replace(tmp, self.path)
        except OSError:
            return
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _entries(self) -> dict[str, Any]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}


def _entry_key(spec: JobSpec) -> str:
    """What decides a check's answer: the target and space asked for, whether it runs here (the local
    runner), this machine and the TVM release that checked it."""
    asked = {
        "target": spec.target,
        "space": spec.space,
        "local": spec.runner.is_local,
        "machine": machine_fingerprint(),
        "tvm": _tvm_release(),
    }
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()


@functools.cache
def machine_fingerprint() -> str:
    """This machine's CPU as the kernel describes it (model, instruction-set flags, CPUs), without TVM."""
    described = [platform.machine(), str(os.cpu_count())]
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        described.append(platform.processor())
    else:
        first_cpu = cpuinfo.split("\n\n", 1)[0]
        described += [
            line.split(":", 1)[1].strip()
            for line in first_cpu.splitlines()
            if line.split(":", 1)[0].strip() in ("vendor_id", "model name", "cpu family", "model", "flags")
        ]
    return hashlib.sha256("\n".join(described).encode()).hexdigest()


@functools.cache
def _tvm_release() -> str:
    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        return "unknown"


__all__ = ["CheckedTarget", "KnownTargets", "machine_fingerprint"]
