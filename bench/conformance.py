"""ONNX's own backend node tests through Kiln, beside onnxruntime and plain TVM.

    .venv/bin/python bench/conformance.py [--only REGEX] [--jobs 2] [--timeout 120]

The ``onnx`` wheel ships the cases that generate its backend node tests (``onnx.backend.test.case.node``:
each a model, its inputs and its expected outputs, with the tolerances the suite uses). Every case is run
by three implementations, each in a worker process of its own (a crash or a hang costs that case only):

* **kiln**: the model saved as a file and imported by Kiln (``tuner.frontend.load_model``, with its input
  shapes given), planned by Kiln's graph passes for this CPU (``tuner.passes.plan.plan_graph``), built untuned
  (no records: each kernel as TVM lowers it) and run;
* **tvm**: plain TVM, what a user gets without Kiln: ``relax.frontend.onnx.from_onnx`` with TVM's own
  conversion table on the model as given, then ``tvm.compile``;
* **onnxruntime**: an ``InferenceSession`` on the CPU provider;
* **kiln-bound**: Kiln as a user runs it with ``--input-value``: every graph input whose value reaches
  only the parameter operands of nodes (:data:`PARAMETER_INPUTS`: a shape, axes, sizes, scales, pads,
  k, a quantization scale …), directly or through the arithmetic computing one, bound to the case's value
  at import, the other inputs fed at run time. A case with no such input has Kiln's outcome.

A case passes when every output has the expected shape and dtype and its values are within the case's
``rtol``/``atol`` (``np.testing.assert_allclose``, as ONNX's backend test runner checks them). Printed:
the pass counts; the outcomes by category for each implementation; the cases plain TVM passes and Kiln
fails (Kiln's own regressions); Kiln's failures grouped by category and operator. The raw results (every case's outcome and message) go to
``bench/work/conformance-STAMP.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _report import command_line, start_run, table, write_json

from tuner.frontend.onnx_simplify import PARAMETER_INPUTS

IMPLEMENTATIONS = ("kiln", "tvm", "onnxruntime", "kiln-bound")
PASS = "pass"


@dataclass(frozen=True)
class Outcome:
    """How one implementation did on one case: ``pass`` or a failure category, and the message."""

    case: str
    implementation: str
    category: str
    message: str = ""
    seconds: float = 0.0


class _Failed(Exception):
    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def _short(err: BaseException) -> str:
    lines = [ln.strip() for ln in (str(err) or type(err).__name__).splitlines() if ln.strip()]
    text = " ".join(lines[:3]) or type(err).__name__
    return f"{type(err).__name__}: {text[:400]}"


def _staged(stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except _Failed:
        raise
    except Exception as err:  # noqa: BLE001 - every failure is a category of the report
        raise _Failed(stage, _short(err)) from None


def compare_outputs(expected: list[Any], got: list[Any], rtol: float, atol: float) -> None:
    """Raise ``_Failed`` unless ``got`` matches ``expected`` as ONNX's backend test runner checks it."""
    if len(got) != len(expected):
        raise _Failed("wrong outputs", f"{len(got)} outputs, expected {len(expected)}")
    for i, (ref, out) in enumerate(zip(expected, got, strict=True)):
        _compare(f"output {i}", ref, out, rtol, atol)


def _compare(what: str, ref: Any, out: Any, rtol: float, atol: float) -> None:
    import numpy as np

    if isinstance(ref, list) or isinstance(out, list):  # sequences: element by element
        if not (isinstance(ref, list) and isinstance(out, list)) or len(ref) != len(out):
            raise _Failed("wrong outputs", f"{what}: not the expected sequence")
        for j, (r, o) in enumerate(zip(ref, out, strict=True)):
            _compare(f"{what}[{j}]", r, o, rtol, atol)
        return
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.shape != out.shape:
        raise _Failed("wrong shape", f"{what}: shape {out.shape}, expected {ref.shape}")
    if ref.dtype != out.dtype:
        raise _Failed("wrong dtype", f"{what}: dtype {out.dtype}, expected {ref.dtype}")
    if ref.dtype == object or ref.dtype.kind in "SU":
        if not np.array_equal(ref, out):
            raise _Failed("wrong values", f"{what} differs")
        return
    try:
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)
    except AssertionError as err:
        detail = " ".join(
            line.strip() for line in str(err).splitlines() if "Mismatch" in line or "Max" in line
        )
        raise _Failed("wrong values", f"{what}: {detail[:300]}") from None


def _arrays(values: list[Any]) -> list[Any]:
    """The case's inputs or outputs as numpy arrays (the cases keep some as TensorProto or numpy scalars)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    def array(value: Any) -> Any:
        if isinstance(value, list):  # a sequence
            return [array(v) for v in value]
        return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)

    return [array(v) for v in values]


def _tensors_only(inputs: list[Any]) -> list[Any]:
    """Kiln and TVM's VM take tensors: a case fed sequences or optionals fails as such."""
    if any(isinstance(x, list) or x is None for x in inputs):
        raise _Failed("sequence input", "an input is a sequence or an optional")
    return inputs


def _input_names(model: Any) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers]


def _run_onnxruntime(model: Any, inputs: list[Any]) -> list[Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = _staged(
        "load", ort.InferenceSession, model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs, strict=False))
    return _staged("run", session.run, None, feeds)


def _run_tvm(model: Any, inputs: list[Any]) -> list[Any]:

    from kiln_tvm import frontends, tvm
    from kiln_tvm.onnx_converters import tvm_table_only
    from tuner.compile import LoadedModel
    from tuner.targets import host_target, to_tvm_target

    names = _input_names(model)
    arrays = _tensors_only(inputs)
    importer = frontends.onnx_importer()
    with tvm_table_only():
        mod = _staged(
            "import",
            importer.from_onnx,
            model,
            shape_dict={n: list(a.shape) for n, a in zip(names, arrays, strict=False)},
            dtype_dict={n: str(a.dtype) for n, a in zip(names, arrays, strict=False)},
            keep_params_in_input=False,
        )
    executable = _staged("build", tvm.compile, mod, target=to_tvm_target(host_target()))
    return _staged("run", lambda: LoadedModel(executable).run(arrays))


def _kiln_import_category(err: Exception) -> str:
    from tuner.errors import InvalidModel, UnsupportedOperator

    if isinstance(err, UnsupportedOperator):
        return "unsupported operator"
    if isinstance(err, InvalidModel) and "opset" in err.message:
        return "opset"
    if isinstance(err, InvalidModel) and err.message.startswith("the ONNX importer could not convert"):
        return "import"
    return "refused input"


def _run_kiln(
    model: Any, inputs: list[Any], names: list[str] | None = None, input_values: dict[str, Any] | None = None
) -> list[Any]:

    from kiln_tvm import ms
    from tuner.compile import LoadedModel, build_tuned
    from tuner.errors import KilnError
    from tuner.frontend import load_model
    from tuner.passes.plan import plan_graph
    from tuner.targets import host_target, to_tvm_target

    names = _input_names(model) if names is None else names
    arrays = _tensors_only(inputs)
    target = to_tvm_target(host_target())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            shapes = {n: a.shape for n, a in zip(names, arrays, strict=False)}
            imported = load_model(path, shapes, input_values=input_values)
        except KilnError as err:
            raise _Failed(_kiln_import_category(err), err.message[:400]) from None
        except Exception as err:  # noqa: BLE001
            raise _Failed("import", _short(err)) from None
    plan = _staged("plan", plan_graph, imported.mod, target)
    executable = _staged("build", build_tuned, plan, target, ms.database.MemoryDatabase())
    return _staged("run", lambda: LoadedModel(executable).run(arrays))


def parameter_inputs(model: Any) -> list[str]:
    """The graph inputs whose values reach only parameter operands (:data:`PARAMETER_INPUTS`) of the
    graph's nodes, directly or through nodes whose every output does (an expanded function computing a
    shape from one): what a user would bind."""
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, position))
    outputs = {o.name for o in model.graph.output}
    only_parameters: dict[str, bool] = {}
    for node in reversed(model.graph.node):  # consumers before producers: the nodes are sorted
        for value in node.output:
            only_parameters[value] = value not in outputs and _feeds_only_parameters(
                value, consumers, only_parameters
            )
    return [
        n
        for n in _input_names(model)
        if n not in outputs and consumers.get(n) and _feeds_only_parameters(n, consumers, only_parameters)
    ]


def _feeds_only_parameters(
    value: str, consumers: dict[str, list[tuple[Any, int]]], only_parameters: dict[str, bool]
) -> bool:
    for node, position in consumers.get(value, []):
        if position in PARAMETER_INPUTS.get(node.op_type, ()):
            continue
        if not node.output or not all(only_parameters.get(o, False) for o in node.output):
            return False
    return True


def _run_kiln_bound(model: Any, inputs: list[Any]) -> list[Any]:
    bound = set(parameter_inputs(model))
    names = _input_names(model)
    arrays = _tensors_only(inputs)
    values = {n: a.tolist() for n, a in zip(names, arrays, strict=False) if n in bound}
    fed = [(n, a) for n, a in zip(names, arrays, strict=False) if n not in bound]
    return _run_kiln(model, [a for _, a in fed], names=[n for n, _ in fed], input_values=values)


_RUNNERS = {
    "kiln": _run_kiln,
    "tvm": _run_tvm,
    "onnxruntime": _run_onnxruntime,
    "kiln-bound": _run_kiln_bound,
}


def _cases() -> dict[str, Any]:
    import onnx.backend.test.case.node as node_cases

    return {case.name: case for case in node_cases.collect_testcases()}


def run_case(case: Any, implementation: str) -> Outcome:
    """One implementation on every data set of one case."""
    started = time.perf_counter()
    try:
        for inputs, expected in case.data_sets:
            arrays = _staged("inputs", _arrays, list(inputs))
            got = _RUNNERS[implementation](case.model, arrays)
            compare_outputs(_staged("inputs", _arrays, list(expected)), list(got), case.rtol, case.atol)
    except _Failed as failed:
        return Outcome(case.name, implementation, failed.category, str(failed), time.perf_counter() - started)
    return Outcome(case.name, implementation, PASS, "", time.perf_counter() - started)


def _worker(conn: Connection) -> None:
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    cases = _cases()
    while True:
        task = conn.recv()
        if task is None:
            return
        name, implementation = task
        conn.send(asdict(run_case(cases[name], implementation)))


@dataclass
class _Slot:
    process: Any
    conn: Connection
    task: tuple[str, str] | None = None
    since: float = 0.0


def _start(ctx: Any) -> _Slot:
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_worker, args=(child,), daemon=True)
    process.start()
    return _Slot(process, parent)


def run_all(tasks: list[tuple[str, str]], jobs: int, timeout: float) -> list[Outcome]:
    """Run ``(case, implementation)`` tasks on ``jobs`` workers; a worker that dies or overruns its
    ``timeout`` is replaced and its task recorded as crashed or timed out."""
    ctx = mp.get_context("spawn")
    pending = list(reversed(tasks))
    slots = [_start(ctx) for _ in range(min(jobs, len(tasks)))]
    results: list[Outcome] = []
    while pending or any(s.task for s in slots):
        for i, slot in enumerate(slots):
            if slot.task is None and pending:
                slot.task, slot.since = pending.pop(), time.monotonic()
                slot.conn.send(slot.task)
            if slot.task is None:
                continue
            name, implementation = slot.task
            if slot.conn.poll(0.05):
                try:
                    results.append(Outcome(**slot.conn.recv()))
                    slot.task = None
                    continue
                except EOFError:
                    pass
            dead = not slot.process.is_alive()
            late = time.monotonic() - slot.since > timeout
            if dead or late:
                slot.process.kill()
                slot.process.join()
                code = slot.process.exitcode
                category = "timeout" if late and not dead else "crashed"
                detail = f"over {timeout:.0f} s" if category == "timeout" else f"worker exit code {code}"
                results.append(Outcome(name, implementation, category, detail, time.monotonic() - slot.since))
                slots[i] = _start(ctx)
        done = len(results)
        if done and done % 200 == 0:
            print(f"  {done}/{len(tasks)}", flush=True)
    for slot in slots:
        slot.conn.send(None)
        slot.process.join(timeout=10)
    return results


def case_operator(case: Any) -> str:
    """What a case tests: its one operator, or for an expanded function body (``*_expanded``) the
    operator it expands."""
    nodes = [n.op_type for n in case.model.graph.node if n.op_type != "Constant"]
    if len(set(nodes)) == 1:
        return nodes[0]
    return re.sub(r"_expanded(_ver\d+)?$", "", case.name).removeprefix("test_") + " (several nodes)"


def failures(outcomes: list[Outcome], operators: dict[str, str], implementation: str = "kiln") -> str:
    """The cases ``implementation`` fails, grouped by category and operator: the count and one message."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        if o.implementation == implementation and o.category != PASS:
            groups.setdefault((o.category, operators.get(o.case, "?")), []).append(o)
    rows = [
        [category, operator, len(found), found[0].message[:140].replace("|", "/")]
        for (category, operator), found in sorted(
            groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])
        )
    ]
    return table(["category", "operator", "cases", "a message"], rows)


def report(outcomes: list[Outcome], names: list[str]) -> str:
    """The pass counts, the categories per implementation, and Kiln's regressions against plain TVM."""
    by = {(o.case, o.implementation): o for o in outcomes}
    total = len(names)
    lines = [
        table(
            ["implementation", "passed", "of", "share"],
            [
                [
                    impl,
                    n := sum(by[(c, impl)].category == PASS for c in names if (c, impl) in by),
                    total,
                    f"{n / total:.0%}",
                ]
                for impl in IMPLEMENTATIONS
                if any((c, impl) in by for c in names)
            ],
        ),
        "",
    ]
    categories = Counter((o.implementation, o.category) for o in outcomes)
    kinds = sorted({cat for _, cat in categories}, key=lambda k: (k != PASS, k))
    present = [impl for impl in IMPLEMENTATIONS if any(i == impl for i, _ in categories)]
    lines.append(
        table(["outcome", *present], [[k, *(categories.get((i, k), 0) for i in present)] for k in kinds])
    )
    regressions = sorted(
        c
        for c in names
        if by.get((c, "tvm")) and by[(c, "tvm")].category == PASS and by[(c, "kiln")].category != PASS
    )
    lines += ["", f"plain TVM passes, Kiln fails: {len(regressions)}"]
    lines += [f"- {c}: {by[(c, 'kiln')].category}: {by[(c, 'kiln')].message[:200]}" for c in regressions]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="a regular expression the case names must match")
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case and implementation")
    args = parser.parse_args()
    implementations = [i.strip() for i in args.implementations.split(",") if i.strip()]
    unknown = [i for i in implementations if i not in IMPLEMENTATIONS]
    if unknown:
        parser.error(f"unknown implementation {unknown[0]!r}; known: {', '.join(IMPLEMENTATIONS)}")
    run_stamp, _, mach = start_run("conformance")
    names = sorted(n for n in _cases() if re.search(args.only, n))
    print(f"{len(names)} cases x {len(implementations)} implementations, {args.jobs} workers")
    started = time.monotonic()
    cases = _cases()
    # kiln-bound differs from kiln only where a case has parameter inputs; elsewhere it has kiln's outcome.
    copied = (
        {n for n in names if not parameter_inputs(cases[n].model)} if "kiln" in implementations else set()
    )
    tasks = [(n, i) for n in names for i in implementations if not (i == "kiln-bound" and n in copied)]
    outcomes = run_all(tasks, args.jobs, args.timeout)
    outcomes += [
        Outcome(o.case, "kiln-bound", o.category, o.message, 0.0)
        for o in list(outcomes)
        if o.implementation == "kiln" and o.case in copied and "kiln-bound" in implementations
    ]
    print(f"wall time {time.monotonic() - started:.0f} s\n")
    text = report(outcomes, names)
    print(text)
    operators = {n: case_operator(cases[n]) for n in names}
    print(f"\nKiln's failures by category and operator:\n{failures(outcomes, operators)}")
    if "kiln-bound" in implementations:
        bound_failures = failures(outcomes, operators, "kiln-bound")
        print(f"\nKiln's failures with parameter inputs bound:\n{bound_failures}")
    path = write_json(
        "conformance",
        run_stamp,
        {"command": command_line(), "machine": mach, "outcomes": [asdict(o) for o in outcomes]},
    )
    print(f"\nraw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
