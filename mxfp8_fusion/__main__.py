"""``python -m mxfp8_fusion demo``: the main job (see ``demo.py``).

The benchmarks are scripts of a repository checkout, run by path (``python
benchmarks/end_to_end.py``); they are not part of the installed package.
"""

from __future__ import annotations

import argparse
import sys


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
    args = parser.parse_args(argv)
    from .demo import main as demo_main

    return demo_main(args.device)


if __name__ == "__main__":
    sys.exit(main())
