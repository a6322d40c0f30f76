"""What this machine's CPU reports of itself (Linux's ``/proc/cpuinfo``), beyond LLVM's name for it.

LLVM names a CPU from its model number; under a hypervisor that name can be an older part than the one
the guest runs on (seen: an AMX-capable Xeon reported as ``rocketlake``, which has no AMX, AVX512-BF16 or
AVX512-FP16). The kernel's flags say what the guest may execute.
"""

from __future__ import annotations

from functools import lru_cache

#: ``/proc/cpuinfo`` flags and the LLVM target features they enable (the ones Kiln's kernels choose by).
LLVM_FEATURE_OF_FLAG = {
    "avx512_vnni": "avx512vnni",
    "avx_vnni": "avxvnni",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "amx_tile": "amx-tile",
    "amx_int8": "amx-int8",
    "amx_bf16": "amx-bf16",
}


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The ``flags`` of the first CPU in ``/proc/cpuinfo`` (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def llvm_features() -> frozenset[str]:
    """The LLVM features of :data:`LLVM_FEATURE_OF_FLAG` this CPU has."""
    flags = cpu_flags()
    return frozenset(feature for flag, feature in LLVM_FEATURE_OF_FLAG.items() if flag in flags)
