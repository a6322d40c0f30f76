"""Quantized models: Kiln int8 against Kiln fp32, onnxruntime int8 and onnxruntime fp32, side by side.

    .venv/bin/python bench/int8.py [--models mlp,cnn,transformer] [--time 10m] [--rounds 5] [--quick]

Each model is written here in PyTorch with seeded random weights, exported to ONNX (fp32) and quantized
by onnxruntime's own ``quantize_static`` (QDQ format, u8 activations, s8 per-channel weights, calibrated
on 16 seeded inputs), the way users produce int8 models:

* ``mlp``: a batch of 32 through 512 -> 2048 -> 2048 -> 512 with ReLUs (matmul-heavy);
* ``cnn``: 1x64x56x56 through four 3x3 convolutions (64 channels, ReLU), a stride-2 one to 128, global
  average pooling and a 128 -> 10 classifier;
* ``transformer``: one BERT-style encoder block (sequence 128, hidden 256, 4 heads, FFN 1024, GELU, layer
  norm); the attention's activation x activation matmuls stay in float in Kiln (reported).

Kiln tunes the int8 and the fp32 model cold, each with the same time budget, through its product path.
Then, in interleaved rounds, each implementation runs in a fresh process on the same seeded inputs
(bench/_timing.py). Printed per model: the latencies and ratios, each int8 output's largest difference
from onnxruntime int8's in output quantization steps, what Kiln computed in integers and on which
kernels (AMX, VNNI or plain), and Kiln int8's hottest kernel against the int8 peak: on an AMX CPU 32
times the measured fp32 FMA peak (one ``tdpbusd`` does 16 x 16 x 64 multiply-adds in 16 cycles, 1024 a
cycle against two ``vfmadd zmm`` of 16), on a VNNI CPU four times (one ``vpdpbusd zmm`` does 64 u8 x s8
multiply-adds where one ``vfmadd zmm`` does 16, at the same rate on the CPUs seen), elsewhere not given.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _kiln import KilnRun, tune
from _report import chosen_models, command_line, fmt, kernel_sum, load_line, start_run, table, write_json
from _timing import Reps, interleaved, load_outputs, reps_for, save_inputs, time_in_fresh_process
from torch import nn

from cli.durations import format_duration, parse_duration

MODELS = ("mlp", "cnn", "transformer")
KINDS = {
    "kiln-int8": "Kiln int8",
    "kiln-fp32": "Kiln fp32",
    "ort-int8": "onnxruntime int8 (same QDQ model)",
    "ort-fp32": "onnxruntime fp32",
}


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 512)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        convs: list[nn.Module] = []
        for _ in range(4):
            convs += [nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU()]
        self.features = nn.Sequential(*convs, nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU())
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class EncoderBlock(nn.Module):
    def __init__(self, hidden: int = 256, heads: int = 4, ffn: int = 1024) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, hidden = x.shape[1], x.shape[2]
        q, k, v = self.qkv(x).reshape(1, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // self.heads), dim=-1)
        attended = (scores @ v).transpose(1, 2).reshape(1, seq, hidden)
        x = self.norm1(x + self.out(attended))
        return self.norm2(x + self.ffn(x))


def _build(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    if name == "mlp":
        return Mlp(), (32, 512)
    if name == "cnn":
        return Cnn(), (1, 64, 56, 56)
    return EncoderBlock(), (1, 128, 256)


def export(name: str, out: Path, seed: int) -> tuple[Path, Path, tuple[int, ...]]:
    """The fp32 ONNX model and its QDQ int8 twin (onnxruntime's quantize_static), and the input shape."""
    from onnxruntime import quantization

    torch.manual_seed(seed)
    module, shape = _build(name)
    module.eval()
    out.mkdir(parents=True, exist_ok=True)
    fp32, int8 = out / f"{name}_fp32.onnx", out / f"{name}_int8.onnx"
    with torch.no_grad():
        torch.onnx.export(
            module, (torch.randn(shape),), str(fp32), input_names=["x"], dynamo=False, opset_version=17
        )
    rng = np.random.default_rng(seed + 1)

    class Calibration(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(16)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantization.quantize_static(
        str(fp32),
        str(int8),
        Calibration(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    return fp32, int8, shape


def output_step(int8_model: Path) -> float:
    """The scale of the model's last DequantizeLinear: one step of its float output."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(int8_model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    return float(np.asarray(inits[last.input[1]]).reshape(-1)[0])


def hottest_kernel(run: KilnRun, peak_gops: float | None) -> dict[str, Any]:
    """Kiln's task with the largest weight x best latency: its name, share of the kernel time, GOP/s and
    fraction of ``peak_gops``."""
    tasks = [t for t in run.manifest["tasks"] if t.get("best_latency_us")]
    if not tasks:
        return {}
    total = sum(t["weight"] * t["best_latency_us"] for t in tasks)
    top = max(tasks, key=lambda t: t["weight"] * t["best_latency_us"])
    gops = top["flops"] / (top["best_latency_us"] * 1e-6) / 1e9 if top["flops"] else None
    return {
        "name": top["name"],
        "share": top["weight"] * top["best_latency_us"] / total,
        "gops": gops,
        "fraction_of_peak": gops / peak_gops if gops and peak_gops else None,
    }


def bench_model(name: str, time_s: float, reps: Reps, work: Path, seed: int, peak_gops: float | None) -> dict:
    """Quantize, tune both precisions cold and time the four implementations of one model."""
    fp32, int8, shape = export(name, work / "models", seed)
    kiln_int8 = tune(int8, work / name / "kiln-int8", None, f"{name}-int8", seed, time_s=time_s)
    kiln_fp32 = tune(fp32, work / name / "kiln-fp32", None, f"{name}-fp32", seed, time_s=time_s)
    x = np.random.default_rng(seed + 2).standard_normal(shape).astype(np.float32)
    npz = save_inputs(work / name / "inputs.npz", {"x": x})
    out = work / name
    timers = {
        "ort-int8": lambda: time_in_fresh_process("onnxruntime", int8, npz, reps, out_dir=out / "ort-int8"),
        "ort-fp32": lambda: time_in_fresh_process("onnxruntime", fp32, npz, reps, out_dir=out / "ort-fp32"),
        "kiln-int8": lambda: time_in_fresh_process(
            "tvm", kiln_int8.model_so, npz, reps, out_dir=out / "kiln-int8"
        ),
        "kiln-fp32": lambda: time_in_fresh_process(
            "tvm", kiln_fp32.model_so, npz, reps, out_dir=out / "kiln-fp32"
        ),
    }
    runs = interleaved(timers, reps.rounds)
    for r in runs.values():
        r["over_kiln_int8"] = r["ms"] / runs["kiln-int8"]["ms"]
    step = output_step(int8)
    ort_int8 = load_outputs(runs["ort-int8"])[0]
    ort_fp32 = load_outputs(runs["ort-fp32"])[0]
    kiln_out = load_outputs(runs["kiln-int8"])[0]
    return {
        "model": name,
        "runs": runs,
        "output_step": step,
        "kiln_int8_vs_ort_int8_steps": float(np.abs(kiln_out - ort_int8).max() / step),
        "kiln_int8_vs_ort_fp32_max_abs": float(np.abs(kiln_out - ort_fp32).max()),
        "quantization": kiln_int8.manifest.get("quantization", {}),
        "hottest_int8_kernel": hottest_kernel(kiln_int8, peak_gops),
        "kernels": {"int8": kernel_sum(kiln_int8.manifest), "fp32": kernel_sum(kiln_fp32.manifest)},
        "trials": {"int8": kiln_int8.trials_done, "fp32": kiln_fp32.trials_done},
        "kiln": {
            "int8": {k: v for k, v in vars(kiln_int8).items() if k != "inputs"},
            "fp32": {k: v for k, v in vars(kiln_fp32).items() if k != "inputs"},
        },
    }


def report(results: list[dict[str, Any]]) -> str:
    headers = ["model", *[f"{label} ms" for label in KINDS.values()]]
    headers += [
        "ort int8 / Kiln int8",
        "Kiln fp32 / Kiln int8",
        "Kiln int8 - ort int8 (steps)",
        "trials int8/fp32",
        "Kiln int8 e2e / Σ kernels",
    ]
    rows = []
    for res in results:
        runs = res["runs"]
        rows.append(
            [
                res["model"],
                *[fmt(runs[kind]["ms"]) for kind in KINDS],
                f"**{runs['ort-int8']['over_kiln_int8']:.2f}**",
                f"{runs['kiln-fp32']['over_kiln_int8']:.2f}",
                f"{res['kiln_int8_vs_ort_int8_steps']:.1f}",
                f"{res['trials']['int8']}/{res['trials']['fp32']}",
                _e2e_over_kernels(runs["kiln-int8"]["ms"], res.get("kernels", {}).get("int8")),
            ]
        )
    lines = [table(headers, rows), ""]
    for res in results:
        q, hot = res["quantization"], res["hottest_int8_kernel"]
        lines.append(
            f"{res['model']}: {len(q.get('integer_ops', []))} operators in integers on "
            f"{q.get('integer_kernels') or 'no'} kernels ({len(q.get('vnni_packed', []))} packed for VNNI, "
            f"{len(q.get('amx_matmuls', []))} matmuls on AMX tiles), "
            f"{len(q.get('kept_float', []))} kept in float"
            + "".join(f"; float: {k['op']} {k['shapes']}: {k['reason']}" for k in q.get("kept_float", [])[:3])
        )
        if hot:
            lines.append(
                f"  hottest int8 kernel: {hot['name']} ({hot['share']:.0%} of the kernel time), "
                f"{fmt(hot['gops'], '.1f')} GOP/s = {fmt(hot['fraction_of_peak'], '.2f')} of the int8 peak"
            )
    return "\n".join(lines)


def _e2e_over_kernels(e2e_ms: float, kernels: dict[str, Any] | None) -> str:
    """Kiln's end-to-end latency over Σ weight x best kernel latency (1.00: no time outside the kernels)."""
    if not kernels or not kernels["sum_ms"]:
        return "-"
    return f"{e2e_ms / kernels['sum_ms']:.2f} ({fmt(kernels['sum_ms'])} ms)"


def int8_peak(mach: dict[str, Any]) -> tuple[float | None, str]:
    """The machine's int8 peak in GOP/s from its measured fp32 FMA peak, and how it was derived."""
    if {"amx_tile", "amx_int8"} <= set(mach["isa"]):
        # One tdpbusd: 16 x 16 x 64 MACs in 16 cycles = 1024 per cycle, against 2 x 16 fp32 FMAs.
        return 32 * mach["peak_gflops"], "32 x the fp32 FMA peak: AMX tdpbusd"
    if "avx512_vnni" in mach["isa"]:
        return 4 * mach["peak_gflops"], "4 x the fp32 FMA peak: vpdpbusd"
    return None, "no VNNI: not given"


def main() -> None:
    """Parse arguments, run every model, print the tables and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--time", default=None, help="Kiln's tuning budget per model and precision (10m)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="smoke test: a short budget, one round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    time_s = parse_duration(args.time or ("20s" if args.quick else "10m"))
    reps = reps_for(args.quick, args.rounds, Reps(budget_s=10.0))
    names = chosen_models(parser, args.models, MODELS)
    os.environ.setdefault("KILN_LATENCY_ROUNDS", "1")

    run_stamp, work, mach = start_run("int8")
    peak_gops, peak_note = int8_peak(mach)
    print(
        f"Kiln: tuned cold with a {format_duration(time_s)} budget per model and precision (no trial limit)"
    )
    print(f"int8 peak: {fmt(peak_gops, '.1f')} GOP/s ({peak_note})")
    results = []
    for name in names:
        results.append(bench_model(name, time_s, reps, work, args.seed, peak_gops))
        write_json("int8", run_stamp, {"partial": True, "results": results, "machine": mach})
    print()
    print(f"at the end: {load_line()}")
    print(report(results))
    print()
    print("peer ms / Kiln int8 ms > 1: Kiln int8 is that many times faster.")
    payload = {
        "script": "int8",
        "command": command_line(),
        "stamp": run_stamp,
        "time_s": time_s,
        "reps": vars(reps),
        "machine": mach,
        "load_average_end": os.getloadavg(),
        "results": results,
    }
    print(f"raw results: {write_json('int8', run_stamp, payload)}")


if __name__ == "__main__":
    main()
