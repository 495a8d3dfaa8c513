"""What ``benchmarks/gemm.py --sweep``, ``--tune`` and ``--plot`` run; not scripts of their
own (run benchmarks/gemm.py):

* :mod:`.points`: one worker process, one weight shape at some token counts: each point's
  contenders compiled, checked, then timed under the GPU lock;
* :mod:`.runs`: the workers started, watched for hangs and the deadline, and their results
  merged into a receipt;
* :mod:`.report`: what a receipt becomes: the printed summary, the measured table module
  (kernels/gemm_sm90/tuning/table.json) and the plot of ratios to cuBLAS BF16.
"""
