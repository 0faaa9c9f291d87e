"""Export of flight descriptors for the boards: fp32 ONNX (standard ops, BatchNorm folded) with
the outputs the host needs for two-stage matching, and its parity check against torch."""
