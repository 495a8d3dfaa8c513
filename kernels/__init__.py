"""The kernels, installed as ``mxfp8_fusion.kernels``: CuTe DSL kernels (the slice quantizer
for Hopper and Blackwell, the MXFP8 GEMM for sm_90a) and the Blackwell GEMM's host code,
which calls cuBLAS through torch.

Importing this package never imports cutlass: each kernel module imports it lazily, inside
its compile function. ``dispatch`` says whether a kernel serves a given call.
"""
