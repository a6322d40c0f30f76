"""Kernel anatomy: a matmul and a convolution contract two operands as deep as their reduction, a
depthwise convolution shallowly, and softmax or layer norm not at all."""

from __future__ import annotations

from kiln_tvm import tvm
from schedules.anatomy import (
    GEMM_MIN_DEPTH,
    argument_bytes,
    arithmetic_intensity,
    contraction_depth,
    is_gemm_like,
)

te = tvm.te


def _func(*tensors: te.Tensor) -> tvm.tirx.PrimFunc:
    return te.create_prim_func(list(tensors))


def test_a_matmul_is_as_deep_as_its_inner_dimension() -> None:
    a, b = te.placeholder((64, 256), name="a"), te.placeholder((256, 32), name="b")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((64, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    func = _func(a, b, c)
    assert contraction_depth(func) == 256 and is_gemm_like(func)


def test_a_convolution_contracts_channels_times_window() -> None:
    data, weight = te.placeholder((1, 16, 10, 10), name="x"), te.placeholder((8, 16, 3, 3), name="w")
    rc, ry, rx = te.reduce_axis((0, 16), "rc"), te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    out = te.compute(
        (1, 8, 8, 8),
        lambda n, f, y, x: te.sum(data[n, rc, y + ry, x + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv",
    )
    assert contraction_depth(_func(data, weight, out)) == 144


def test_a_depthwise_convolution_is_too_shallow_to_be_gemm_like() -> None:
    data, weight = te.placeholder((1, 16, 10, 10), name="x"), te.placeholder((16, 3, 3), name="w")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    out = te.compute(
        (1, 16, 8, 8),
        lambda n, c, y, x: te.sum(data[n, c, y + ry, x + rx] * weight[c, ry, rx], axis=[ry, rx]),
        name="dw",
    )
    func = _func(data, weight, out)
    assert contraction_depth(func) == 9 < GEMM_MIN_DEPTH and not is_gemm_like(func)


def test_softmax_and_layer_norm_contract_nothing() -> None:
    x = te.placeholder((4, 128), name="x")
    k = te.reduce_axis((0, 128), name="k")
    peak = te.compute((4,), lambda i: te.max(x[i, k], axis=k), name="max")
    e = te.compute((4, 128), lambda i, j: te.exp(x[i, j] - peak[i]), name="exp")
    k2 = te.reduce_axis((0, 128), name="k2")
    total = te.compute((4,), lambda i: te.sum(e[i, k2], axis=k2), name="sum")
    soft = te.compute((4, 128), lambda i, j: e[i, j] / total[i], name="softmax")
    assert contraction_depth(_func(x, soft)) == 0

    k3 = te.reduce_axis((0, 128), name="k3")
    mean = te.compute((4,), lambda i: te.sum(x[i, k3] / 128.0, axis=k3), name="mean")
    k4 = te.reduce_axis((0, 128), name="k4")
    var = te.compute((4,), lambda i: te.sum((x[i, k4] - mean[i]) * (x[i, k4] - mean[i]), axis=k4), name="var")
    assert contraction_depth(_func(x, var)) == 0


def test_a_matrix_vector_product_is_deep_but_memory_bound() -> None:
    x, w = te.placeholder((1, 1280), name="x"), te.placeholder((1280, 1000), name="w")
    k = te.reduce_axis((0, 1280), name="k")
    y = te.compute((1, 1000), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), name="y")
    func = _func(x, w, y)
    assert contraction_depth(func) == 1280
    assert argument_bytes(func) == 4 * (1280 + 1280 * 1000 + 1000)
    intensity = arithmetic_intensity(func)
    assert intensity is not None and intensity < 1 and not is_gemm_like(func)
