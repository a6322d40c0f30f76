"""What both benchmarks print and save: the machine, its fp32 peak, markdown tables and the raw JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from _timing import physical_cores

BENCH = Path(__file__).resolve().parent
WORK = BENCH / "work"
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def stamp() -> str:
    """A timestamp for this run's file names."""
    return time.strftime("%Y%m%d-%H%M%S")


def command_line() -> str:
    """The command line exactly as it was typed (interpreter included)."""
    return shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))


def _cpuinfo() -> dict[str, str]:
    """Fields of the first processor in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def _flop_per_cycle(info: dict[str, str]) -> tuple[int, str]:
    """fp32 FLOP per cycle per core from the ISA, and why."""
    flags = set(info.get("flags", "").split())
    amd = info.get("vendor_id") == "AuthenticAMD"
    family = int(info.get("cpu family", "0") or 0)
    if "avx512f" in flags and amd and family == 25:
        return 32, "AVX-512 on Zen 4 is double-pumped on 2x256-bit FMA pipes: 2 pipes x 8 lanes x 2 (FMA)"
    if "avx512f" in flags:
        return 64, "AVX-512 with 2 FMA units: 2 units x 16 lanes x 2 (FMA); a 1-FMA-unit part has half"
    if {"avx2", "fma"} <= flags:
        return 32, "AVX2+FMA with 2x256-bit FMA pipes (Zen 2/3, Haswell+): 2 pipes x 8 lanes x 2 (FMA)"
    if "avx" in flags:
        return 16, "AVX without FMA: one 8-lane add + one 8-lane multiply per cycle"
    return 8, "SSE: one 4-lane add + one 4-lane multiply per cycle"


def machine() -> dict[str, Any]:
    """CPU, cores, ISA and the fp32 peak: measured with Kiln's FMA kernel (``kiln machine``), and the nominal
    figure cores x FLOP/cycle x the clock /proc/cpuinfo reports, for comparison."""
    from tuner.targets import host_target
    from tuner.timing.roofline import measure_limits

    info = _cpuinfo()
    cores = physical_cores()
    per_cycle, why = _flop_per_cycle(info)
    mhz = float(info.get("cpu MHz", "0") or 0)
    nominal = cores * per_cycle * mhz / 1e3
    limits = measure_limits(host_target())
    how = (
        f"{limits.peak_gflops:.1f} GFLOP/s measured on {limits.threads} threads "
        f"({limits.peak_gflops_one_thread:.1f} on one; `kiln machine`: {limits.how}); nominal "
        f"{cores} physical cores x {per_cycle} FLOP/cycle [{why}] x {mhz / 1e3:.3f} GHz "
        f"[/proc/cpuinfo 'cpu MHz', which a VM or a boosting CPU exceeds] = {nominal:.1f} GFLOP/s"
    )
    return {
        "cpu": info.get("model name", platform.processor()),
        "vendor": info.get("vendor_id"),
        "family": info.get("cpu family"),
        "model": info.get("model"),
        "isa": sorted(f for f in info.get("flags", "").split() if f.startswith(("avx", "fma", "amx"))),
        "physical_cores": cores,
        "cpu_mhz": mhz,
        "flop_per_cycle": per_cycle,
        "peak_gflops": limits.peak_gflops,
        "nominal_peak_gflops": nominal,
        "bandwidth_gbs": limits.bandwidth_gbs,
        "peak_how": how,
        "python": platform.python_version(),
        "versions": versions(),
    }


def versions() -> dict[str, str | None]:
    """Installed versions of the packages compared (without importing them)."""
    found: dict[str, str | None] = {}
    for name in (
        "apache-tvm",
        "apache-tvm-ffi",
        "numpy",
        "onnxruntime",
        "openvino",
        "torch",
        "threadpoolctl",
    ):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def load_line() -> str:
    """The 1-minute load average, with a warning when other processes are likely to skew the figures."""
    load = os.getloadavg()[0]
    busy = load > 0.5 * physical_cores()
    note = " -- WARNING: other processes are running; figures will be noisy" if busy else ""
    return f"load average (1 min): {load:.2f}{note}"


def openblas_line(result: dict[str, Any]) -> str:
    """Which OpenBLAS the child ran: its variables and what threadpoolctl reported."""
    rt = result["runtime"]
    env = ", ".join(f"{v}={rt.get(v) or '<unset>'}" for v in OPENBLAS_VARS)
    pools = rt.get("threadpools")
    if not isinstance(pools, list):
        return f"{env}; {pools}"
    blas = [p for p in pools if p.get("internal_api") == "openblas"]
    kernel = ", ".join(
        f"OpenBLAS {p['version']} kernel {p['architecture']}, {p['num_threads']} threads" for p in blas
    )
    return f"{env}; threadpoolctl: {kernel or 'no OpenBLAS loaded'}"


def manifest_line(label: str, manifest: dict[str, Any]) -> str:
    """Kiln's own latency figures from the artifact manifest, measured by run_job in the tuning process."""
    lat = manifest.get("latency", {})
    refs = ", ".join(f"{k} {fmt(v)} ms" for k, v in (lat.get("reference_ms") or {}).items())
    return (
        f"{label}: Kiln's manifest (run_job, in the tuning process): tuned {fmt(lat.get('tuned_ms'))} ms, "
        f"untuned {fmt(lat.get('untuned_ms'))} ms" + (f", {refs}" if refs else "")
    )


def chosen_models(parser: argparse.ArgumentParser, value: str, known: tuple[str, ...]) -> list[str]:
    """The models a comma-separated ``--models`` names, or the parser's error naming an unknown one."""
    names = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(known)}")
    return names


def start_run(script: str) -> tuple[str, Path, dict[str, Any]]:
    """Begin a benchmark run: print the command, the machine (with its fp32 peak) and the load; return the
    run's stamp, its work directory ``bench/work/<script>-<stamp>`` and :func:`machine`."""
    run_stamp = stamp()
    mach = machine()
    print(f"command: {command_line()}")
    print(f"machine: {mach['cpu']}, {mach['physical_cores']} physical cores, ISA {' '.join(mach['isa'])}")
    print(f"fp32 peak: {mach['peak_how']}")
    print(f"memory bandwidth (STREAM triad): {mach['bandwidth_gbs']:.1f} GB/s")
    print(load_line())
    return run_stamp, WORK / f"{script}-{run_stamp}", mach


def kernel_sum(manifest: dict[str, Any]) -> dict[str, Any]:
    """Σ weight x best measured latency over the tuned tasks (ms), and the tasks without a measurement."""
    tasks = manifest.get("tasks", [])
    measured = [t for t in tasks if t.get("best_latency_us") is not None]
    return {
        "sum_ms": sum(t["weight"] * t["best_latency_us"] for t in measured) / 1e3,
        "tasks": len(tasks),
        "unmeasured": [t["name"] for t in tasks if t.get("best_latency_us") is None],
    }


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number, or 'n/a'."""
    return "n/a" if value is None else format(value, spec)


def write_json(script: str, run_stamp: str, payload: dict[str, Any]) -> Path:
    """Write the raw results to ``bench/work/<script>-<stamp>.json``."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"{script}-{run_stamp}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path
