"""Quantization of float models: calibration inputs, static int8 with onnxruntime's quantizer, and the
accuracy control that returns the operators hurting the user's metric most to float."""
