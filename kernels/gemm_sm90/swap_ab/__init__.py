"""The swap-AB GEMM kernel for up to 64 tokens: the weight is the wgmma M operand."""
