"""The slice quantizer: BF16/FP16 slices into MXFP8 storage, for every arch in its ARCHS."""
