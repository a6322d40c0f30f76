"""The downloadable artifact: ``model.so``, ``manifest.json``, the tuning records and ``run.py``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln_tvm import ms
from kiln_tvm.x86_amx import permission_constructor_object
from tuner.entities import StoredRecord
from tuner.intrinsics_module import PACKAGE, intrinsics_used, write_intrinsics_package
from tuner.metaschedule.database import readable_record

RECORDS_PER_WORKLOAD = 32

RUN_PY = '''"""Load and run this Kiln artifact with plain Apache TVM (apache-tvm==0.27.0.post1).

    python run.py            # random inputs from manifest.json; prints outputs and latency
    python run.py --records  # also reads the tuning records (after registering Kiln's intrinsics)
"""
import json
import os
import sys
import time
from pathlib import Path

here = Path(__file__).resolve().parent
manifest = json.loads((here / "manifest.json").read_text())
# TVM uses half the cores on x86 unless told; use the core count the model was tuned for.
os.environ.setdefault("TVM_NUM_THREADS", str(manifest["target"].get("num-cores", os.cpu_count())))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

if "--records" in sys.argv:
    # The records' schedules may use Kiln's tensor intrinsics: kiln_intrinsics/ (plain TVM) registers them.
    sys.path.insert(0, str(here))
    if (here / "kiln_intrinsics").is_dir():
        import kiln_intrinsics  # noqa: E402, F401
    from tvm.s_tir import meta_schedule as ms  # noqa: E402

    db = ms.database.JSONDatabase(
        path_workload=str(here / "records" / "database_workload.json"),
        path_tuning_record=str(here / "records" / "database_tuning_record.json"),
    )
    print(f"records: {len(db.get_all_tuning_records())} tuning records read")

lib = tvm.runtime.load_module(str(here / "model.so"))
vm = relax.VirtualMachine(lib, tvm.cpu())
# Weights were pre-packed at compile time; this returns them (an empty list when they are constants).
params = list(vm["main_transform_params"]([])) if vm.module.implements_function("main_transform_params") else []

rng = np.random.default_rng(0)
inputs = [rng.standard_normal(spec["shape"]).astype(spec["dtype"]) for spec in manifest["inputs"]]
args = [tvm.runtime.tensor(x) for x in inputs] + params
outputs = vm["main"](*args)
outputs = [outputs] if hasattr(outputs, "numpy") else list(outputs)
for spec, out in zip(manifest["outputs"], outputs):
    print(spec["name"], out.numpy().shape, out.numpy().ravel()[:5])

timer = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=20, min_repeat_ms=100)
print(f"latency: {timer(*args).median * 1e3:.3f} ms (manifest says {manifest['latency']['tuned_ms']:.3f} ms)")
'''


@dataclass(frozen=True)
class ArtifactFile:
    """Where an artifact was written."""

    path: Path
    sha256: str
    size_bytes: int


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_records(rows: list[StoredRecord], dest: Path, per_workload: int = RECORDS_PER_WORKLOAD) -> int:
    """Write records in MetaSchedule's JSON database layout, loadable by ``ms.database.JSONDatabase``.

    The fastest ``per_workload`` valid records of each workload are kept. Returns the number of records written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    by_workload: dict[int, list[tuple[float, str, str]]] = defaultdict(list)
    for row in rows:
        run_secs = [float(s) for s in json.loads(row.record_json)[1] or []]
        if not run_secs:
            continue
        by_workload[row.workload_id].append(
            (sum(run_secs) / len(run_secs), row.workload_json, row.record_json)
        )
    jdb = ms.database.JSONDatabase(
        path_workload=str(dest / "database_workload.json"),
        path_tuning_record=str(dest / "database_tuning_record.json"),
        allow_missing=True,
    )
    written = 0
    for entries in by_workload.values():
        entries.sort(key=lambda e: e[0])
        workload = jdb.commit_workload(ms.database.Workload.from_json(json.loads(entries[0][1])).mod)
        readable = (readable_record(rjson, workload) for _, _, rjson in entries)
        for record in itertools.islice((r for r in readable if r is not None), per_workload):
            jdb.commit_tuning_record(record)
            written += 1
    return written


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Silence TVM's C++ log lines on fd 2 ("Warning: Scope Saving:" once per function on export)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def export_library(executable: Any, dest: Path, amx: bool = False) -> Path:
    """Export a compiled model as a shared library (linked with the system C++ compiler). With ``amx``
    (kernels tuned for AMX tiles), the library asks Linux for AMX state when it is loaded."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _native_stderr_muted(), tempfile.TemporaryDirectory() as workdir:
        addons = [str(permission_constructor_object(Path(workdir)))] if amx else None
        executable.export_library(str(dest), addons=addons)
    return dest


def pack_artifact(
    library: Path,
    manifest: dict[str, Any],
    record_rows: list[StoredRecord],
    dest: Path,
) -> ArtifactFile:
    """Pack the exported library, manifest, records and run.py into ``dest`` (.tar.gz)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-artifact-") as tmp:
        root = Path(tmp)
        shutil.copyfile(library, root / "model.so")
        manifest = dict(manifest)
        manifest["records"] = write_records(record_rows, root / "records")
        intrinsics = write_records_intrinsics(root / "records", root)
        manifest["files"] = [
            "model.so",
            "manifest.json",
            "run.py",
            "README.md",
            "records/database_workload.json",
            "records/database_tuning_record.json",
            *([f"{PACKAGE}/"] if intrinsics else []),
        ]
        manifest["tensor_intrinsics"] = sorted(intrinsics)
        (root / "README.md").write_text(artifact_readme(manifest, bool(intrinsics)))
        (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
        (root / "run.py").write_text(RUN_PY)
        partial = dest.with_suffix(dest.suffix + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            for name in sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()):
                tar.add(root / name, arcname=name)
        shutil.move(partial, dest)
    return ArtifactFile(path=dest, sha256=file_sha256(dest), size_bytes=dest.stat().st_size)


def records_tarball(rows: list[StoredRecord], top_dir: str = "records") -> bytes:
    """Every valid record of ``rows`` as a .tar.gz of a MetaSchedule JSON database (for downloads), with
    ``kiln_intrinsics/`` beside it when the records use Kiln's tensor intrinsics."""
    with tempfile.TemporaryDirectory(prefix="kiln-records-") as tmp:
        dest = Path(tmp) / top_dir
        write_records(rows, dest, per_workload=sys.maxsize)
        intrinsics = write_records_intrinsics(dest, Path(tmp))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(dest, arcname=top_dir)
            if intrinsics:
                tar.add(Path(tmp) / PACKAGE, arcname=PACKAGE)
        return buffer.getvalue()


def write_records_intrinsics(records_dir: Path, dest: Path) -> set[str]:
    """Write ``dest/kiln_intrinsics/`` for the Kiln tensor intrinsics the records in ``records_dir`` use;
    the names (empty: none used, nothing written)."""
    used = intrinsics_used([(records_dir / "database_tuning_record.json").read_text()])
    write_intrinsics_package(dest, used)
    return used


def artifact_readme(manifest: dict[str, Any], intrinsics: bool) -> str:
    """The artifact's README.md: what is in it, how to run it and how to read its records with plain TVM."""
    register = (
        f"import {PACKAGE}  # noqa: F401  (registers Kiln's tensor intrinsics: "
        f"{', '.join(manifest['tensor_intrinsics'])})\n"
        if intrinsics
        else ""
    )
    why = (
        f"\nThe records' schedules use tensor intrinsics of Kiln's own; `{PACKAGE}/` (plain TVM, no Kiln) "
        "registers them, and must be imported before the records are read, or MetaSchedule fails with "
        '"TensorIntrin ... is not registered".\n'
        if intrinsics
        else ""
    )
    return f"""# Kiln artifact: {manifest.get("model", {}).get("name", "model")}

Compiled and verified by Kiln for `{manifest.get("target_key", "")}`. Needs only Apache TVM
(`pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1`) and NumPy.

- `model.so`: the compiled model (load with `tvm.runtime.load_module`, run with `relax.VirtualMachine`)
- `manifest.json`: inputs, outputs, target, latencies, verification, tuning budget
- `run.py`: runs the model on random inputs and times it: `python run.py`; `python run.py --records` also
  reads the tuning records
- `records/`: the tuning records, a MetaSchedule JSON database (the best schedules of each kernel)
{f"- `{PACKAGE}/`: registers the tensor intrinsics the records use" if intrinsics else ""}
{why}
## Reading the records with plain TVM

```python
{register}from tvm.s_tir import meta_schedule as ms

db = ms.database.JSONDatabase(
    path_workload="records/database_workload.json",
    path_tuning_record="records/database_tuning_record.json",
)
for record in db.get_all_tuning_records():
    print(record.trace)
```
"""
