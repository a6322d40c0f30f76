"""Graph passes: what Kiln does to a model's Relax program before its kernels are tuned (layouts,
precision, quantization lowering, weight packing, fusion) and the plan of tasks they leave."""
