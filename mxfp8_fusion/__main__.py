"""``python -m mxfp8_fusion demo|bench``.

``demo`` is the main job (see ``demo.py``); ``bench`` runs the end-to-end benchmark of a
repository checkout (``benchmarks/end_to_end.py``, CUDA only) and writes its receipt.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "end_to_end.py"


def _device(text: str):
    """``--device``: checked before the demo starts, so a bad one is a usage error."""
    from .demo import resolve_device

    try:
        return resolve_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; a bad argument exits with status 2 and one line."""
    parser = argparse.ArgumentParser(prog="python -m mxfp8_fusion")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="stage a drafter-like projection and compare it with the concatenated one"
    )
    demo.add_argument(
        "--device", type=_device, default=None, help="cuda or cpu (default: cuda when present)"
    )
    commands.add_parser(
        "bench", help="end-to-end benchmark (CUDA); arguments go to benchmarks/end_to_end.py"
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from .demo import main as demo_main

        return demo_main(args.device)
    import torch

    if not torch.cuda.is_available():
        parser.error("bench measures GPU kernels and needs a CUDA device")
    if not _BENCH.exists():
        parser.error(f"bench needs a repository checkout: {_BENCH} not found")
    sys.argv = [str(_BENCH), *rest]
    sys.path.insert(0, str(_BENCH.parent))  # as `python benchmarks/end_to_end.py` would
    runpy.run_path(str(_BENCH), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
