"""CuTe DSL kernels for the H200 (sm_90a), installed as ``mxfp8_fusion.kernels``.

Importing this package never imports cutlass: each kernel module imports it lazily, inside
its compile function. ``dispatch`` says whether a kernel serves a given call.
"""
