"""The fastest artifact within an accuracy budget: Kiln's default job on a float model with calibration
inputs, against the peers a user would quantize with, side by side, with every one's accuracy.

    .venv/bin/python bench/precision.py [--models cnn,encoder,ocr] [--time 5m] [--rounds 3] [--samples 64]

Per model, the same samples (rendered here, not noise, where the model is pretrained), split by Kiln into
calibration and validation halves:

* ``cnn``: ResNet-18 (transformers' constructor, seeded random weights, 1x3x224x224) on images of drawn
  shapes (circles, boxes, triangles in random colours on random backgrounds, ImageNet-normalized);
* ``encoder``: a 3-layer DistilBERT (transformers, seeded random weights, 128 tokens) on token ids drawn
  from word-like runs;
* ``ocr``: RapidOCR's pretrained PP-OCRv4 text recognizer (``rapidocr-onnxruntime``'s wheel ships it), on
  text lines rendered here (words and numbers, Pillow's font, 48 px high, padded to 320 wide, as RapidOCR
  prepares them); its answer is the CTC-decoded text.

Implementations, each timed in its own fresh process in interleaved rounds (``bench/_timing.py``):

* Kiln ``auto`` (the default): the float ONNX model and the calibration file, tuned cold for ``--time``;
* onnxruntime fp32; onnxruntime int8: ``quantize_static`` (QDQ, u8 activations, per-channel s8 weights,
  MinMax) on the same calibration half, after its ``quant_pre_process``;
* OpenVINO's default precision (bf16 on CPUs with AVX512-BF16 or AMX, else fp32); OpenVINO int8: NNCF's
  ``quantize`` (its default preset) on the same calibration half.

Accuracy, of every implementation against the float32 model (onnxruntime fp32) on the validation half:
the share of rows whose top-1 changed (class scores), the norm-wise relative error (every output) and,
for ``ocr``, the share of text lines whose decoded text changed.
"""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _kiln import KilnRun, tune
from _report import chosen_models, command_line, fmt, load_line, start_run, table, write_json
from _timing import Reps, interleaved, reps_for, save_inputs, time_in_fresh_process

from cli.durations import format_duration, parse_duration
from tuner.entities import TensorSpec
from tuner.quantization.calibration import CalibrationSet, read_calibration

MODELS = ("cnn", "encoder", "ocr")
KINDS = {
    "kiln": "Kiln auto",
    "ort-fp32": "onnxruntime fp32",
    "ort-int8": "onnxruntime int8",
    "ov": "OpenVINO default",
    "ov-int8": "OpenVINO int8 (NNCF)",
}
OCR_WIDTH = 320
WORDS = [
    "kiln",
    "tuned",
    "compiler",
    "tensor",
    "schedule",
    "invoice",
    "total",
    "amount",
    "paid",
    "receipt",
    "order",
    "number",
    "date",
    "street",
    "north",
    "river",
    "station",
    "coffee",
    "bread",
    "milk",
    "price",
    "quantity",
    "2026",
    "17.50",
    "3.99",
    "42",
    "1024",
    "Hello",
    "World",
    "Rapid",
    "Text",
]


# --------------------------------------------------------------------------------------------------
# Models and their inputs


def _static(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """``model`` with its one input's dimensions fixed to ``shape`` (the recognizer declares them
    dynamic), so that every implementation compiles the same static model."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, size in zip(dims, shape, strict=True):
        dim.Clear()
        dim.dim_value = size
    return model


def build_model(name: str, out: Path, seed: int) -> tuple[Path, TensorSpec]:
    """The float ONNX model ``name`` in ``out`` and its input."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.onnx"
    if name == "ocr":
        import rapidocr_onnxruntime

        source = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_rec_infer.onnx"
        shape = (1, 3, 48, OCR_WIDTH)
        # Opset 12 as shipped: onnxruntime's quantize_static writes a per-channel DequantizeLinear axis
        # that opset rejects, so every implementation gets the model at opset 13 (as Kiln converts it).
        from onnx import version_converter

        onnx.save(version_converter.convert_version(_static(onnx.load(str(source)), shape), 13), path)
        return path, TensorSpec("x", shape, "float32")
    from _held_out_models import export as export_held_out

    held_out = {"cnn": "resnet18", "encoder": "distilbert_3l"}[name]
    exported = export_held_out(held_out, out, seed)
    exported.rename(path)
    spec = {
        "cnn": TensorSpec("x", (1, 3, 224, 224), "float32"),
        "encoder": TensorSpec("x", (1, 128), "int64"),
    }
    return path, spec[name]


def drawn_shapes(count: int, seed: int) -> np.ndarray:
    """``count`` 224x224 RGB images of drawn shapes, ImageNet-normalized, NCHW float32."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    images = []
    for _ in range(count):
        image = Image.new("RGB", (224, 224), tuple(int(c) for c in rng.integers(0, 256, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 6))):
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            x0, y0 = (int(v) for v in rng.integers(0, 160, 2))
            x1, y1 = x0 + int(rng.integers(20, 64)), y0 + int(rng.integers(20, 64))
            kind = int(rng.integers(0, 3))
            if kind == 0:
                draw.ellipse((x0, y0, x1, y1), fill=colour)
            elif kind == 1:
                draw.rectangle((x0, y0, x1, y1), fill=colour)
            else:
                draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=colour)
        pixels = (np.asarray(image, dtype=np.float64) / 255.0 - mean) / std
        images.append(pixels.transpose(2, 0, 1).astype(np.float32))
    return np.stack(images)


def token_runs(count: int, seed: int) -> np.ndarray:
    """``count`` sequences of 128 token ids: word-like runs of ids, [CLS] first and [SEP] last."""
    rng = np.random.default_rng(seed)
    vocabulary = rng.integers(1000, 30000, 400)
    rows = []
    for _ in range(count):
        ids = rng.choice(vocabulary, 128)
        ids[0], ids[-1] = 101, 102
        rows.append(ids)
    return np.stack(rows).astype(np.int64)


def text_lines(count: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """``count`` rendered text lines as the recognizer takes them ([N, 3, 48, 320], (x / 255 - 0.5) / 0.5,
    the line resized to 48 px high and padded on the right), and their text."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    font = ImageFont.load_default(size=28)
    lines, texts = [], []
    for _ in range(count):
        text = " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
        left, top, right, bottom = font.getbbox(text)
        ink = int(rng.integers(0, 80))
        paper = int(rng.integers(180, 256))
        image = Image.new("RGB", (right - left + 16, bottom - top + 16), (paper, paper, paper))
        ImageDraw.Draw(image).text((8 - left, 8 - top), text, font=font, fill=(ink, ink, ink))
        width = min(OCR_WIDTH, int(np.ceil(48 * image.width / image.height)))
        resized = np.asarray(image.resize((width, 48)), dtype=np.float32)
        line = np.zeros((3, 48, OCR_WIDTH), np.float32)
        line[:, :, :width] = ((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
        lines.append(line)
        texts.append(text)
    return np.stack(lines), texts


def samples_for(name: str, spec: TensorSpec, count: int, seed: int) -> np.ndarray:
    """``count`` samples of the model's input, stacked along the batch axis."""
    if name == "cnn":
        return drawn_shapes(count, seed)
    if name == "encoder":
        return token_runs(count, seed)
    return text_lines(count, seed)[0]


def ctc_texts(scores: np.ndarray, characters: list[str]) -> list[str]:
    """Greedy CTC decoding of ``[batch, steps, classes]`` scores (class 0: blank), as RapidOCR decodes."""
    texts = []
    for row in scores.argmax(-1):
        kept = [c for i, c in enumerate(row) if c != 0 and (i == 0 or c != row[i - 1])]
        texts.append("".join(characters[c] for c in kept if c < len(characters)))
    return texts


def ocr_characters(path: Path) -> list[str]:
    """The recognizer's character list (its ONNX metadata), with CTC's blank first and a space last."""
    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return ["blank", *meta["character"].splitlines(), " "]


# --------------------------------------------------------------------------------------------------
# The peers' quantization


def _feeds(samples: tuple[dict[str, np.ndarray], ...]) -> list[dict[str, np.ndarray]]:
    return [dict(s) for s in samples]


def ort_int8(fp32: Path, calibration: CalibrationSet, out: Path) -> Path:
    """onnxruntime's ``quantize_static`` of ``fp32`` on the calibration half (after its pre-processing)."""
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared, int8 = out / "ort_prepared.onnx", out / "ort_int8.onnx"
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(_feeds(calibration.calibration))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    q.quantize_static(
        str(prepared),
        str(int8),
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        per_channel=True,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
    )
    return int8


def nncf_int8(fp32: Path, calibration: CalibrationSet, out: Path, transformer: bool) -> Path:
    """NNCF's ``quantize`` of ``fp32`` (read by OpenVINO) on the calibration half, saved as OpenVINO IR
    (``transformer``: NNCF's transformer model type, which its documentation asks for such models)."""
    import nncf
    import openvino

    model = openvino.Core().read_model(str(fp32))
    quantized = nncf.quantize(
        model,
        nncf.Dataset(_feeds(calibration.calibration)),
        subset_size=len(calibration.calibration),
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
    )
    xml = out / "nncf_int8.xml"
    openvino.save_model(quantized, str(xml))
    return xml


# --------------------------------------------------------------------------------------------------
# Accuracy on the validation half


def _runner(kind: str, path: Path) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """One implementation as a function of a sample's feed (its outputs), in this process."""
    if kind == "kiln":
        import tvm
        from tvm import relax

        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())

        def run_tvm(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            out = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()])
            items = out if isinstance(out, (list, tuple)) or hasattr(out, "__len__") else [out]
            return [np.asarray(o.numpy()) for o in items]

        return run_tvm
    if kind.startswith("ort"):
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda feed: [np.asarray(o) for o in session.run(None, feed)]
    import openvino

    compiled = openvino.Core().compile_model(str(path), "CPU")
    outputs = list(compiled.outputs)
    return lambda feed: [np.asarray(compiled(feed)[o]) for o in outputs]


def accuracy(
    kind: str,
    path: Path,
    validation: tuple[dict[str, np.ndarray], ...],
    floats: list[list[np.ndarray]],
    characters: list[str] | None,
) -> dict[str, Any]:
    """``kind``'s outputs on the validation samples against the float32 model's ``floats``."""
    run = _runner(kind, path)
    outs = [run(dict(feed)) for feed in validation]
    got, want = np.concatenate([o[0] for o in outs]), np.concatenate([f[0] for f in floats])
    result: dict[str, Any] = {
        "relative_error": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
    }
    if got.ndim >= 2 and got.shape[-1] >= 2 and (characters is not None or got.ndim == 2):
        result["top1_changed"] = float(np.mean(got.argmax(-1) != want.argmax(-1)))
    if characters is not None:
        mine, theirs = ctc_texts(got, characters), ctc_texts(want, characters)
        result["text_changed"] = float(np.mean([a != b for a, b in zip(mine, theirs, strict=True)]))
        result["examples"] = list(zip(theirs[:3], mine[:3], strict=True))
    return result


# --------------------------------------------------------------------------------------------------
# One model


def bench_model(name: str, args: argparse.Namespace, reps: Reps, work: Path) -> dict[str, Any]:
    """Quantize with each peer, tune Kiln's default job, time the five implementations, judge accuracy."""
    out = work / name
    fp32, spec = build_model(name, out / "models", args.seed)
    samples = samples_for(name, spec, args.samples, args.seed + 1)
    buffer = io.BytesIO()
    np.savez(buffer, **{spec.name: samples})
    calibration_file = out / "inputs.npz"
    calibration_file.write_bytes(buffer.getvalue())
    # The split Kiln makes of the file: the peers calibrate on the same half, all are judged on the other.
    calibration = read_calibration(buffer.getvalue(), (spec,), max_bytes=1 << 32)

    paths: dict[str, Path] = {"ort-fp32": fp32, "ov": fp32}
    paths["ort-int8"] = ort_int8(fp32, calibration, out)
    paths["ov-int8"] = nncf_int8(fp32, calibration, out, transformer=name == "encoder")
    run: KilnRun = tune(
        fp32,
        out / "kiln",
        None,
        name,
        args.seed,
        time_s=args.time_s,
        precision="auto",
        calibration=calibration_file,
    )
    paths["kiln"] = run.model_so

    npz = save_inputs(out / "timing_inputs.npz", dict(calibration.validation[0]))
    kinds = {
        "kiln": "tvm",
        "ort-fp32": "onnxruntime",
        "ort-int8": "onnxruntime",
        "ov": "openvino",
        "ov-int8": "openvino",
    }
    timers = {
        key: (
            lambda key=key: time_in_fresh_process(kinds[key], paths[key], npz, reps, out_dir=out / f"t-{key}")
        )
        for key in KINDS
    }
    runs = interleaved(timers, reps.rounds)
    for r in runs.values():
        r["over_kiln"] = r["ms"] / runs["kiln"]["ms"]

    characters = ocr_characters(fp32) if name == "ocr" else None
    floats = [_runner("ort-fp32", fp32)(dict(feed)) for feed in calibration.validation]
    judged = {key: accuracy(key, paths[key], calibration.validation, floats, characters) for key in KINDS}
    report = run.manifest.get("quantization", {}).get("from_float") or {}
    return {
        "model": name,
        "samples": calibration.describe(),
        "runs": runs,
        "accuracy": judged,
        "kiln_precision": run.manifest.get("precision", {}),
        "kiln_quantization": report,
        "kiln_integer_kernels": run.manifest.get("quantization", {}).get("integer_kernels"),
        "trials": run.trials_done,
        "kiln": {k: v for k, v in vars(run).items() if k != "inputs"},
    }


def _accuracy_cell(acc: dict[str, Any]) -> str:
    parts = []
    if "text_changed" in acc:
        parts.append(f"text {acc['text_changed']:.1%}")
    if "top1_changed" in acc:
        parts.append(f"top-1 {acc['top1_changed']:.1%}")
    parts.append(f"rel {acc['relative_error']:.3f}")
    return ", ".join(parts)


def report(results: list[dict[str, Any]]) -> str:
    headers = ["model", *[f"{label} ms" for label in KINDS.values()]]
    headers += [f"{KINDS[k]} / Kiln" for k in KINDS if k != "kiln"]
    rows, accuracy_rows = [], []
    for res in results:
        runs = res["runs"]
        rows.append(
            [
                res["model"],
                *[fmt(runs[k]["ms"]) for k in KINDS],
                *[f"**{runs[k]['over_kiln']:.2f}**" for k in KINDS if k != "kiln"],
            ]
        )
        accuracy_rows.append([res["model"], *[_accuracy_cell(res["accuracy"][k]) for k in KINDS]])
    geo = [
        "geometric mean",
        *["" for _ in KINDS],
        *[
            f"**{np.exp(np.mean([np.log(r['runs'][k]['over_kiln']) for r in results])):.2f}**"
            for k in KINDS
            if k != "kiln"
        ],
    ]
    lines = [
        table(headers, [*rows, geo]),
        "",
        "accuracy against the float32 model on the validation half:",
        "",
    ]
    lines.append(table(["model", *KINDS.values()], accuracy_rows))
    for res in results:
        q = res["kiln_quantization"]
        choice = res["kiln_precision"].get("choice", "")
        lines.append(
            f"{res['model']}: {res['samples']}; Kiln {choice} on {res['kiln_integer_kernels']} kernels"
        )
        if q.get("returned"):
            lines.append(f"  returned to float32: {', '.join(q['returned'])}")
        if "examples" in res["accuracy"]["kiln"]:
            lines.append(f"  float -> Kiln text: {res['accuracy']['kiln']['examples']}")
    return "\n".join(lines)


def main() -> None:
    """Parse arguments, run every model, print the tables and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--time", default=None, help="Kiln's tuning budget per model (default 5m)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5)")
    parser.add_argument("--samples", type=int, default=64, help="rendered samples per model, half validated")
    parser.add_argument("--quick", action="store_true", help="smoke test: a short budget, one round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.time_s = parse_duration(args.time or ("20s" if args.quick else "5m"))
    reps = reps_for(args.quick, args.rounds, Reps(budget_s=10.0))
    names = chosen_models(parser, args.models, MODELS)
    os.environ.setdefault("KILN_LATENCY_ROUNDS", "1")
    run_stamp, work, mach = start_run("precision")
    print(
        f"Kiln: default (auto) job with the calibration file, tuned cold for {format_duration(args.time_s)}"
    )
    results = []
    for name in names:
        results.append(bench_model(name, args, reps, work))
        write_json("precision", run_stamp, {"partial": True, "results": results, "machine": mach})
    print()
    print(f"at the end: {load_line()}")
    print(report(results))
    print()
    print("peer ms / Kiln ms > 1: Kiln is that many times faster.")
    write_json(
        "precision",
        run_stamp,
        {
            "script": "precision",
            "command": command_line(),
            "stamp": run_stamp,
            "machine": mach,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
