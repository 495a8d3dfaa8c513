"""The MXFP8 GEMM for sm_90a: host side, config and its choice, and the two kernels."""
