"""``torch.compile(model, backend="kiln")``: captured graphs compiled with Kiln's records, misses tuned or
queued, and graphs Kiln cannot compile run eagerly (needs the ``torch`` extra)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.model_builders import build_torch_mlp, build_torch_relu6_cnn
from tuner.entities import JobStatus
from tuner.errors import InvalidSpec
from tuner.jobs.pipeline import run_job
from tuner.schedule_choice import ScheduleSource
from tuner.settings import Settings
from tuner.store import Store

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow


_seen_before: set[int] = set()


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    from tuner.capture import compiled_graphs

    torch._dynamo.reset()
    _seen_before.clear()
    _seen_before.update(id(g) for g in compiled_graphs())
    yield
    torch._dynamo.reset()


def _graphs() -> list[Any]:
    """The graphs Kiln compiled in this test, oldest first."""
    from tuner.capture import compiled_graphs

    return [g for g in compiled_graphs() if id(g) not in _seen_before]


def _compile(module: Any, tmp_path: Path, **options: Any) -> Any:
    return torch.compile(module, backend="kiln", options={"data_dir": str(tmp_path), **options})


class _Lgamma(torch.nn.Module):
    """A linear layer, then an operator TVM's PyTorch importer lacks (lgamma)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return torch.lgamma(self.fc(x).abs() + 1.0)


class _Broken(torch.nn.Module):
    """Two linear layers with a graph break between them: Dynamo captures two graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(y)


def test_backend_is_registered_through_the_entry_point() -> None:
    assert "kiln" in torch._dynamo.list_backends()


@pytest.mark.parametrize("freeze", [False, True], ids=["weights-as-inputs", "frozen"])
def test_captured_cnn_matches_eager_and_no_kernel_is_left_serial(tmp_path: Path, freeze: bool) -> None:
    torch.manual_seed(0)
    module = build_torch_relu6_cnn()
    x = torch.randn(1, 3, 16, 16)
    compiled = _compile(module, tmp_path, freeze=freeze)
    with torch.no_grad():
        got, want = compiled(x), module(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    (graph,) = _graphs()
    report = graph.report
    assert report.frozen is freeze and not report.dynamic
    assert report.kernels and report.tuned == 0  # an empty store: nothing tuned yet
    # Every kernel gets a schedule (a rule's, the analytic one, the model's best tiling or a design-space
    # sample): none is compiled as TVM's serial, unscheduled loops.
    assert all(k.source is not ScheduleSource.NONE for k in report.kernels), report.kernels
    assert any(k.source is ScheduleSource.ANALYTIC for k in report.kernels)  # the convolution
    if not freeze:  # the weights are read at each call: a change is seen
        with torch.no_grad():
            module[0].weight.mul_(2.0)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)


def test_tune_in_process_applies_the_jobs_records_and_a_fresh_compile_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_PROFILE_BUDGET_S", "0")
    module = build_torch_mlp()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = _compile(module, tmp_path, tune=12)(x)
        torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-5)
    (graph,) = _graphs()
    report = graph.report
    store = Store.from_settings(Settings(data_dir=tmp_path, database_url=None))
    job = store.get_job(report.job_id)
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert report.tuned >= 1

    # Each kernel the graph calls tuned is the job's best record of that very workload.
    best = {t.workload_hash: t.best_latency_us for t in store.list_tasks(job.id) if t.best_latency_us}
    tuned = [k for k in report.kernels if k.source is ScheduleSource.TUNED]
    for kernel in tuned:
        assert kernel.workload_hash in best
        assert kernel.latency_ms == pytest.approx(best[kernel.workload_hash] / 1e3, rel=1e-6)

    # A new process (here: a reset Dynamo) compiling the same model finds the records without tuning.
    torch._dynamo.reset()
    with torch.no_grad():
        again = _compile(module, tmp_path)(x)
    torch.testing.assert_close(again, module(x), rtol=1e-4, atol=1e-5)
    fresh = _graphs()[-1].report
    assert fresh.job_id is None
    assert {k.workload_hash for k in fresh.kernels if k.source is ScheduleSource.TUNED} == {
        k.workload_hash for k in tuned
    }


def test_a_miss_is_queued_as_a_job_and_the_graph_is_rebuilt_when_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KILN_PROFILE_BUDGET_S", "0")
    monkeypatch.setenv("KILN_CAPTURE_POLL_S", "0.01")
    module = build_torch_mlp()
    x = torch.randn(2, 16)
    compiled = _compile(module, tmp_path, tune="queue", trials=8, name="mlp")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)
    (graph,) = _graphs()
    settings = Settings(data_dir=tmp_path, database_url=None)
    store = Store.from_settings(settings)
    job = store.get_job(graph.report.job_id)
    assert job.status is JobStatus.QUEUED and job.spec.trials == 8
    assert store.get_model(job.spec.model_id).name.startswith("mlp-")
    assert graph.report.tuned == 0

    result = run_job(store, settings, job.id)  # what a worker does with it
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)
    assert graph.report.tuned >= 1  # rebuilt with the job's records on the call after it finished


def test_an_unsupported_operator_runs_eagerly_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = _Lgamma().eval()
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="kiln.capture"), torch.no_grad():
        got = _compile(module, tmp_path)(x)
    torch.testing.assert_close(got, module(x))
    assert "runs eagerly" in caplog.text and "lgamma" in caplog.text
    assert _graphs() == []

    torch._dynamo.reset()
    with pytest.raises(Exception, match="lgamma"), torch.no_grad():
        _compile(module, tmp_path, strict=True)(x)


def test_graph_break_compiles_each_graph(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _Broken().eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        got = _compile(module, tmp_path)(x)
        torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-5)
    assert len(_graphs()) == 2


def test_autograd_graphs_run_eagerly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = build_torch_mlp()
    x = torch.randn(2, 16)
    with caplog.at_level(logging.WARNING, logger="kiln.capture"):
        got = _compile(module, tmp_path)(x)
    got.sum().backward()  # eager: gradients flow
    assert module[0].weight.grad is not None
    assert "torch.no_grad()" in caplog.text


def test_dynamic_shapes_compile_untuned_and_say_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = build_torch_mlp()
    compiled = torch.compile(module, backend="kiln", dynamic=True, options={"data_dir": str(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="kiln.capture"), torch.no_grad():
        for batch in (2, 5):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-5)
    (graph,) = _graphs()
    assert graph.report.dynamic
    assert "symbolic shapes" in caplog.text and "untuned" in caplog.text


def test_unknown_option_is_an_error_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="unknown torch.compile option") as info, torch.no_grad():
        _compile(build_torch_mlp(), tmp_path, frozen=True)(torch.randn(1, 16))
    assert isinstance(getattr(info.value, "inner_exception", info.value), InvalidSpec)
    assert "freeze" in str(info.value)


def test_a_call_that_fails_in_tvm_runs_eagerly_from_then_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    module = build_torch_mlp()
    x = torch.randn(2, 16)
    compiled = _compile(module, tmp_path)
    with torch.no_grad():
        compiled(x)
        (graph,) = _graphs()

        def broken(*_: Any) -> Any:
            raise RuntimeError("injected fault in the compiled kernel")

        graph._runner = (broken, [])  # a kernel that fails at run time
        with caplog.at_level(logging.WARNING, logger="kiln.capture"):
            torch.testing.assert_close(compiled(x), module(x))
            torch.testing.assert_close(compiled(x), module(x))
    assert "runs eagerly" in caplog.text and "injected fault" in caplog.text
    assert any("eagerly" in note for note in graph.report.notes)


class _NormThenLinear(torch.nn.Module):
    """A layer norm reads the input first: its vectorised loads take the input's buffer as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(256)
        self.fc = torch.nn.Linear(256, 64)

    def forward(self, x: Any) -> Any:
        return self.fc(self.norm(x))


@pytest.mark.parametrize("offset", [1, 2, 4, 8])  # floats: 4 to 32 bytes off
def test_inputs_not_aligned_to_64_bytes_are_handled(tmp_path: Path, offset: int) -> None:
    # TVM's kernels assume 64-byte-aligned buffers; a torch view (or a numpy array, 16-byte aligned) is
    # handed over without a copy by DLPack, so a misaligned one must be copied, not read as it is.
    torch.manual_seed(0)
    module = _NormThenLinear().eval()
    base = torch.randn(offset + 128 * 256)
    x = base[offset:].view(1, 128, 256)
    assert x.data_ptr() % 64 != 0
    with torch.no_grad():
        got = _compile(module, tmp_path, freeze=True)(x)
        torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-5)
