"""A cost model catching up on a store's records in a fresh process, as a job's tuning process does first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Loads the shared pool's cost model of a target (argv: database URL, target key) and prints the samples
#: it learnt, the newest record among them, and whether TVM's CUDA intrinsics were parsed on the way.
_CATCH_UP = """
import json, sys

from tuner.metaschedule.cost_model import load_cost_model
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target

store = Store(sys.argv[1])
ranking, last = load_cost_model(store, to_tvm_target(host_target()), sys.argv[2], None)
loaded = "tvm.s_tir.tensor_intrin.cuda" in sys.modules
print(json.dumps({"learnt": ranking.model.data_size, "last": last, "gpu_intrinsics_loaded": loaded}))
"""


def catch_up_in_fresh_process(database_url: str, target_key: str) -> dict[str, object]:
    """What the shared pool's cost model of ``target_key`` (none is kept unless records are shared) learns
    from every record of the store, loaded in a process that has only just started."""
    done = subprocess.run(
        [sys.executable, "-c", _CATCH_UP, database_url, target_key],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
