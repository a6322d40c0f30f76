"""What lets `kiln submit` skip TVM: checked targets kept per machine, and a model stored as it is found
again without importing it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tuner.entities import JobSpec, ModelFormat, ModelSignature, RunnerSpec, TensorSpec
from tuner.jobs import known_targets
from tuner.jobs.known_targets import CheckedTarget, KnownTargets
from tuner.model_registry import register_model, stored_as_is
from tuner.settings import Settings
from tuner.store import Store

CHECKED = CheckedTarget(
    target={"kind": "llvm", "mcpu": "znver3", "num-cores": 2},
    key="llvm -mcpu=znver3 -num-cores=2",
    space="cpu-poly",
)


def _spec(**overrides: object) -> JobSpec:
    return JobSpec(**{"model_id": "", "target": "host", "trials": 8, **overrides})  # type: ignore[arg-type]


def test_a_checked_target_is_found_for_the_same_question_only(tmp_path: Path) -> None:
    known = KnownTargets(tmp_path)
    assert known.get(_spec()) is None
    known.put(_spec(), CHECKED)
    assert KnownTargets(tmp_path).get(_spec(trials=64, seed=3)) == CHECKED  # budget and seed do not matter
    assert known.get(_spec(target="llvm")) is None
    assert known.get(_spec(space="cpu")) is None
    assert known.get(_spec(runner=RunnerSpec("rpc", "127.0.0.1:9190", "pi"))) is None


def test_another_machine_or_tvm_release_checks_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    known = KnownTargets(tmp_path)
    known.put(_spec(), CHECKED)
    monkeypatch.setattr(known_targets, "machine_fingerprint", lambda: "another machine")
    assert known.get(_spec()) is None
    monkeypatch.undo()
    monkeypatch.setattr(known_targets, "_tvm_release", lambda: "0.28.0")
    assert known.get(_spec()) is None
    monkeypatch.undo()
    assert known.get(_spec()) == CHECKED


def test_a_damaged_file_is_an_empty_one_and_is_rewritten_whole(tmp_path: Path) -> None:
    known = KnownTargets(tmp_path)
    known.path.write_text('{"half a')
    assert known.get(_spec()) is None
    known.put(_spec(), CHECKED)
    assert known.get(_spec()) == CHECKED
    assert [p.name for p in tmp_path.iterdir()] == [known_targets.FILE_NAME]  # no temporary file left


def test_only_the_most_recent_entries_are_kept(tmp_path: Path) -> None:
    known = KnownTargets(tmp_path)
    for seed in range(known_targets.MAX_ENTRIES + 1):
        known.put(_spec(space=f"space-{seed}"), CHECKED)
    assert known.get(_spec(space="space-0")) is None
    assert known.get(_spec(space=f"space-{known_targets.MAX_ENTRIES}")) == CHECKED


def test_the_fingerprint_is_this_machine_s_cpu() -> None:
    fingerprint = known_targets.machine_fingerprint()
    assert len(fingerprint) == 64 and fingerprint == known_targets.machine_fingerprint()


# ---- a model stored as it is --------------------------------------------------------------------------


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Store, Settings, Path]:
    """A store holding one model whose bytes are ``model.onnx``'s (input x: [batch, 8] given as [2, 8])."""
    settings = Settings(data_dir=tmp_path / "data", database_url=None)
    store = Store.from_settings(settings)
    store.ensure_schema()
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the bytes of a model")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    settings.blob_dir.mkdir(parents=True)
    (settings.blob_dir / f"{sha}.onnx").write_bytes(path.read_bytes())
    store.add_model(
        name="model",
        format=ModelFormat.ONNX,
        sha256=sha,
        size_bytes=path.stat().st_size,
        signature=ModelSignature(
            inputs=(TensorSpec("x", (2, 8), "float32"),),
            outputs=(TensorSpec("y", (2, 4), "float32"),),
            declared_inputs=(TensorSpec("x", ("batch", 8), "float32"),),
        ),
        blob_path=f"{sha}.onnx",
    )
    return store, settings, path


def test_the_same_bytes_asked_the_same_way_are_the_stored_model(stored: tuple[Store, Settings, Path]) -> None:
    store, settings, path = stored
    found = stored_as_is(store, settings, path, input_shapes={"x": (2, 8)})
    assert found is not None and found.name == "model"


def test_anything_an_import_could_answer_otherwise_imports_again(
    stored: tuple[Store, Settings, Path],
) -> None:
    store, settings, path = stored
    assert stored_as_is(store, settings, path) is None  # a dynamic input without its shape: refused by import
    assert stored_as_is(store, settings, path, input_shapes={"x": (4, 8)}) is None  # other shapes
    assert stored_as_is(store, settings, path, input_shapes={"x": (2, 8), "z": (1,)}) is None  # unknown input
    assert stored_as_is(store, settings, path, input_shapes={"x": (2, 8)}, input_values={"x": 1.0}) is None
    assert stored_as_is(store, settings, path, input_shapes={"x": (2, 8)}, owner="erin") is None
    other = path.with_name("other.onnx")
    other.write_bytes(b"other bytes")
    assert stored_as_is(store, settings, other, input_shapes={"x": (2, 8)}) is None
    for blob in settings.blob_dir.iterdir():
        blob.unlink()  # lost from the data directory: the import brings the bytes back
    assert stored_as_is(store, settings, path, input_shapes={"x": (2, 8)}) is None


def test_registering_stored_bytes_again_imports_nothing(stored: tuple[Store, Settings, Path]) -> None:
    class NoImports:
        def run(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("the model was imported again")

    store, settings, path = stored
    info, new = register_model(store, settings, path, input_shapes={"x": (2, 8)}, sandbox=NoImports())  # type: ignore[arg-type]
    assert not new and info.name == "model"
    with pytest.raises(AssertionError, match="imported again"):
        register_model(store, settings, path, input_shapes={"x": (4, 8)}, sandbox=NoImports())  # type: ignore[arg-type]


def test_a_data_directory_that_cannot_be_written_keeps_nothing_and_fails_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the data directory should be")
    known = KnownTargets(blocked / "data")
    known.put(_spec(), CHECKED)
    assert known.get(_spec()) is None
