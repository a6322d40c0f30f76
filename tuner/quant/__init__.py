"""Quantized models computed in integers: QDQ lowering of convolutions and matmuls, and its report."""
