"""The benchmarks' own tests (CPU): their scripts import each other by name, as they do when
run from a checkout (``python benchmarks/gemm.py``), so benchmarks/ goes on ``sys.path``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
