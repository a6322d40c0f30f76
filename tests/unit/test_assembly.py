"""A compiled model's assembly split kernel by kernel (parallel closures with the kernel that launches
them) and each kernel's instruction mix: FMAs by width, dot products."""

from __future__ import annotations

from tuner.views.assembly import instruction_mix, kernel_assembly, split_functions

ASM = """\
\t.text
\t.type\t__tvm_ffi_fused_dense,@function
__tvm_ffi_fused_dense:
\tpushq\t%rbp
\tcallq\tfused_dense_compute_
\tretq
\t.type\tfused_dense_compute_,@function
fused_dense_compute_:
\tvxorps\t%xmm0, %xmm0, %xmm0
\tcallq\t*%rax
\tretq
\t.type\t.L__tvm_parallel_lambda,@function
.L__tvm_parallel_lambda:
\tvbroadcastss\t(%rsi), %zmm1
\tvfmadd231ps\t%zmm1, %zmm2, %zmm3
\tvfmadd231ps\t(%rdi), %zmm2, %zmm4
\tvfmadd213ps\t%ymm1, %ymm2, %ymm5
\tvdpbf16ps\t%zmm13, %zmm14, %zmm10
\tretq
\t.type\t__tvm_ffi_conv_prepacked,@function
__tvm_ffi_conv_prepacked:
\tretq
\t.type\tconv_prepacked_compute_,@function
conv_prepacked_compute_:
\tvfmadd231ps\t%zmm1, %zmm2, %zmm3
\tretq
\t.type\tconv_weight_prepack_compute_,@function
conv_weight_prepack_compute_:
\tvmovups\t%zmm1, (%rdi)
\tretq
\t.type\t__tvm_ffi_mean,@function
__tvm_ffi_mean:
\tretq
\t.type\tmean_compute_,@function
mean_compute_:
\tvfmadd231ss\t%xmm1, %xmm2, %xmm3
\tvaddss\t%xmm1, %xmm2, %xmm3
\t.p2align\t4
\tretq
"""


def test_each_kernel_gathers_its_wrapper_its_loop_nest_and_its_parallel_closures() -> None:
    functions = split_functions(ASM)
    assert list(functions)[:2] == ["__tvm_ffi_fused_dense", "fused_dense_compute_"]
    assert list(functions)[-2:] == ["__tvm_ffi_mean", "mean_compute_"]
    dense = kernel_assembly(functions, "fused_dense")
    assert "__tvm_ffi_fused_dense:" in dense and ".L__tvm_parallel_lambda:" in dense and "mean" not in dense
    assert "fused_dense" not in kernel_assembly(functions, "mean")
    assert kernel_assembly(functions, "fused") == ""  # a prefix of another kernel's name is not that kernel
    # Weights laid out at load time: the kernel run per inference, not the one-off layout rewrite.
    conv = kernel_assembly(functions, "conv")
    assert "conv_prepacked_compute_:" in conv and "weight_prepack" not in conv


def test_the_mix_counts_fmas_by_width_and_the_dot_products() -> None:
    functions = split_functions(ASM)
    dense = instruction_mix(kernel_assembly(functions, "fused_dense"))
    assert dense["fma"] == {"zmm": 2, "ymm": 1, "xmm": 0, "scalar": 0}
    assert dense["dot_products"] == {"vdpbf16ps": 1} and dense["widest_vector_bits"] == 512
    assert dense["instructions"] == 12  # labels and directives are not instructions
    mean = instruction_mix(kernel_assembly(functions, "mean"))
    assert mean["fma"] == {"zmm": 0, "ymm": 0, "xmm": 0, "scalar": 1} and mean["widest_vector_bits"] == 128
    assert mean["dot_products"] == {} and mean["instructions"] == 4
