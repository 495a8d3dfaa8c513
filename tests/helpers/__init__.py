"""What the tests share: operands, edge-case blocks, pass fixtures, process-group helpers,
and the PTX hash check of the shipped kernels (``python tests/helpers/ptx_hashes.py``)."""
