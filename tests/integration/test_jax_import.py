"""JAX programs exported with ``jax.export`` (.jax) or as StableHLO text (.mlir), imported by Kiln's
StableHLO importer, compiled and tuned, and matched against ``jax.jit`` (needs the ``jax`` extra)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.host_jobs import run_host_job
from tests.jax_models import JaxProgram, export_jax, jax_cnn, jax_mlp, jax_outputs, jax_transformer_block
from tuner.compile import LoadedModel, build_untuned
from tuner.entities import JobStatus, ModelFormat
from tuner.errors import InvalidModel, InvalidSpec, UnsupportedOperator
from tuner.frontend import load_model, read_signature
from tuner.settings import Settings
from tuner.store import Store
from tuner.targets import host_target, to_tvm_target

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

PROGRAMS = {"mlp": jax_mlp, "cnn": jax_cnn, "transformer": jax_transformer_block}


def _check_against_jax(program: JaxProgram, loaded: LoadedModel) -> None:
    for seed in range(2):
        x = program[2](np.random.default_rng(seed))
        got, want = loaded.run([x]), jax_outputs(program, x)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jax", ".mlir"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_exported_program_imports_and_matches_jax_jit(name: str, suffix: str, tmp_path: Path) -> None:
    program = PROGRAMS[name]()
    path = export_jax(program, tmp_path / f"{name}{suffix}")
    imported = load_model(path)
    assert imported.format is (ModelFormat.JAX_EXPORT if suffix == ".jax" else ModelFormat.STABLEHLO)
    shape, dtype = program[1]
    assert [(s.shape, s.dtype) for s in imported.signature.inputs] == [(shape, dtype)]
    assert read_signature(path).inputs == imported.signature.inputs
    _check_against_jax(program, LoadedModel(build_untuned(imported.mod, to_tvm_target(host_target()))))


@pytest.mark.slow
def test_a_jax_program_tunes_end_to_end_and_its_artifact_matches_jax(
    settings: Settings, tmp_path: Path
) -> None:
    program = jax_transformer_block(seq=8, dim=32)
    path = export_jax(program, tmp_path / "block.jax")
    store = Store.from_settings(settings)
    store.ensure_schema()
    result = run_host_job(store, settings, path, trials=8)  # imported in the sandbox, as an upload is
    assert store.get_model(result.job.spec.model_id).format is ModelFormat.JAX_EXPORT
    assert result.job.status is JobStatus.SUCCEEDED, result.job.error
    assert result.comparisons and all(c.ok for c in result.comparisons)
    unpacked = tmp_path / "artifact"
    with tarfile.open(result.artifact.path) as tar:
        tar.extractall(unpacked, filter="data")
    from kiln_tvm import tvm

    _check_against_jax(program, LoadedModel(tvm.runtime.load_module(str(unpacked / "model.so"))))


def test_unsupported_operations_are_listed_all_at_once(tmp_path: Path) -> None:
    def f(x: object) -> object:
        ordered = jnp.sort(x, axis=-1)
        counted = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, ordered))[1]
        return counted + jnp.linalg.inv(x[:, :4])[0, 0]

    exported = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((4, 8), jnp.float32))
    path = tmp_path / "ops.mlir"
    path.write_text(exported.mlir_module())
    with pytest.raises(UnsupportedOperator) as info:
        load_model(path)
    ops = info.value.operators
    assert "stablehlo.sort" in ops and "stablehlo.while" in ops
    assert any(op.startswith("stablehlo.custom_call") for op in ops), ops  # LAPACK's LU factorisation
    assert "StableHLO" in info.value.message


def test_unsupported_form_names_the_operation_and_where(tmp_path: Path) -> None:
    def transposed_conv(x: object) -> object:
        kernel = jnp.ones((3, 3, 4, 4), jnp.float32)
        return jax.lax.conv_transpose(x, kernel, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    path = export_jax((transposed_conv, ((1, 8, 8, 4), "float32"), lambda r: r), tmp_path / "deconv.mlir")
    with pytest.raises(UnsupportedOperator, match="transposed convolution") as info:
        load_model(path)
    assert info.value.operators == ["stablehlo.convolution"]


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("broken.jax", b"\x00\x01not a flatbuffer" * 4, "serialized jax.export"),
        ("broken.mlir", b"module { this is not mlir", "could not parse"),
    ],
)
def test_a_corrupt_jax_file_is_an_invalid_model(tmp_path: Path, name: str, data: bytes, match: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InvalidModel, match=match):
        load_model(path)


def test_a_shape_other_than_the_exported_one_is_refused(tmp_path: Path) -> None:
    path = export_jax(jax_mlp(), tmp_path / "mlp.mlir")
    with pytest.raises(InvalidSpec, match="export it again"):
        load_model(path, {"x": (8, 64)})
