"""The manifest a job's artifact carries: what was tuned, for which target, how fast, and how it was
checked."""

from __future__ import annotations

import dataclasses
import socket
from datetime import datetime, timezone
from typing import Any

import tuner
from kiln_tvm import tvm
from tuner.entities import AccuracyReport, Job, ModelInfo, Task
from tuner.frontend import ImportedModel
from tuner.passes.plan import GraphPlan
from tuner.settings import Settings
from tuner.timing.verify import Comparison, Latencies


def job_manifest(
    job: Job,
    *,
    model: ModelInfo,
    imported: ImportedModel,
    plan: GraphPlan,
    tasks: list[Task],
    latency: Latencies,
    comparisons: list[Comparison],
    settings: Settings,
    accuracy: AccuracyReport | None = None,
) -> dict[str, Any]:
    """The JSON manifest of ``job``'s artifact (``manifest.json`` in the archive)."""
    return {
        "kiln_version": tuner.__version__,
        "tvm_version": tvm.__version__,
        "job_id": job.id,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "model": {"id": model.id, "name": model.name, "format": model.format.value, "sha256": model.sha256},
        "target": job.spec.target,
        "target_key": job.target_key,
        "inputs": [t.to_dict() for t in imported.signature.inputs],
        "outputs": [t.to_dict() for t in imported.signature.outputs],
        # Inputs of the uploaded model bound to values at registration: constants of this one.
        "bound_inputs": [b.to_dict() for b in model.signature.bound_inputs],
        "weight_prepack": plan.weight_prepack,
        "fusion": {
            "operators_before": plan.fusion.operators_before,
            "kernels_after": plan.fusion.kernels_after,
            "distinct_tasks": plan.fusion.distinct_tasks,
            "skipped_passes": plan.fusion.skipped_passes,
        },
        "quantization": {
            "integer_ops": plan.fusion.integer_ops,
            "kept_float": [dataclasses.asdict(k) for k in plan.fusion.kept_float],
            "integer_kernels": plan.fusion.integer_kernels,
            "vnni_packed": plan.fusion.vnni_packed,
            "seven_bit_packed": plan.fusion.seven_bit_packed,
            "amx_matmuls": plan.fusion.amx_matmuls,
            "vnni_unpacked": plan.fusion.vnni_unpacked,
            "accuracy": accuracy.to_dict() if accuracy is not None and accuracy.tolerance is None else None,
            # precision int8: how Kiln quantized the float model (budget, metric, per-operator precision)
            "from_float": accuracy.quantization.to_dict()
            if accuracy is not None and accuracy.quantization is not None
            else None,
        },
        "precision": {
            "policy": job.spec.precision,
            "computed_in": plan.fusion.precision,
            "choice": plan.fusion.precision_choice,
            "reduced_ops": plan.fusion.reduced_ops,
            "compute": plan.fusion.precision_compute,
            "amx_bf16_matmuls": plan.fusion.amx_bf16_matmuls,
            "avx512_bf16_matmuls": plan.fusion.avx512_bf16_matmuls,
            "avx512_bf16_convolutions": plan.fusion.avx512_bf16_convolutions,
            "bf16_unpacked": plan.fusion.bf16_unpacked,
            "note": plan.fusion.precision_note,
            "accuracy": accuracy.to_dict()
            if accuracy is not None and accuracy.tolerance is not None
            else None,
        },
        "tasks": [
            {
                "name": t.name,
                "weight": t.weight,
                "flops": t.flops,
                "workload_hash": t.workload_hash,
                "trials": t.trials,
                "best_latency_us": t.best_latency_us,
                "gflops": t.gflops,
                "search_stats": t.search_stats,
                "schedule_source": t.schedule_source,
            }
            for t in tasks
        ],
        "space": job.spec.space,
        "budget": {
            "trials": job.spec.trials,
            "time_s": job.spec.time_budget_s,
            "max_trials_per_task": job.spec.max_trials_per_task,
            "seed": job.spec.seed,
            "trials_measured": sum(t.trials for t in tasks),
            "tuning_s": round(job.tuning_s, 3),
        },
        "latency": {
            "untuned_ms": latency.untuned_ms,
            "tuned_ms": latency.tuned_ms,
            "speedup": latency.speedup,
            "reference_ms": latency.references_ms,
            "method": "median over interleaved rounds (each round times every implementation once, in a "
            "fresh process, in a rotated order) of the median wall time of main(), same seeded inputs",
            "rounds_ms": {n: list(t.rounds_ms) for n, t in latency.report.timings.items()}
            if latency.report
            else {},
            "warnings": list(latency.report.warnings) if latency.report else [],
            "other_cpu_share": latency.report.other_cpu_share if latency.report else None,
            "measured_on": socket.gethostname() if latency.tuned_ms is not None else None,
        },
        "verification": {
            "tolerance": {"rtol": settings.verify_rtol, "atol": settings.verify_atol}
            if accuracy is None or accuracy.tolerance is None
            else {"norm_wise_relative": accuracy.tolerance},
            "inputs": f"seeded random (seed {job.spec.seed})",
            "checks": [
                {"reference": c.reference, "max_abs_error": c.max_abs_error, "ok": c.ok} for c in comparisons
            ],
            "skipped": None if comparisons else "the target is not this machine's CPU",
        },
    }
