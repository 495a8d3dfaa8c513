"""``python -m mxfp8_fusion demo [--device DEV]``: the main job (see ``demo.py``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mxfp8_fusion")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="stage a drafter-like projection and compare it with the concatenated one"
    )
    demo.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(args.device)
    return 2


if __name__ == "__main__":
    sys.exit(main())
