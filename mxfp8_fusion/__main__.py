"""``python -m mxfp8_fusion demo``: the main job (see ``demo.py``).
``python -m mxfp8_fusion warmup OUTxIN ...``: compile the kernels of MXFP8 projections into
the kernel cache before a server starts (see ``kernel_warmup.py``).
``python -m mxfp8_fusion vllm``: what the vLLM plugin does in this environment, without
starting an engine (see ``vllm/plugin.py``).
``python -m mxfp8_fusion --version``: the versions this runs with, and the GPU; without a
command, the help.

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


def versions() -> str:
    """One line: this package's version, torch's, the DSL's, and the GPU (or its absence)."""
    from importlib import metadata

    import torch

    from . import __version__

    try:
        dsl = metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        dsl = "not installed"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
    else:
        gpu = "none (every call runs the plain-torch reference)"
    return (
        f"mxfp8_fusion {__version__} | torch {torch.__version__} | nvidia-cutlass-dsl {dsl} "
        f"| GPU: {gpu}"
    )


class _Versions(argparse.Action):
    """``--version``, computed when asked for: it imports torch."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the versions and the GPU")

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; a bad argument exits with status 2 and one line.
    Without a command it prints the help."""
    parser = argparse.ArgumentParser(prog="python -m mxfp8_fusion")
    parser.add_argument("--version", action=_Versions)
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser(
        "demo", help="stage a drafter-like projection and compare it with the concatenated one"
    )
    demo.add_argument(
        "--device", type=_device, default=None, help="cuda or cpu (default: cuda when present)"
    )
    _add_warmup(commands)
    commands.add_parser(
        "vllm", help="say what the vLLM plugin does here (exit 0 when any part is on)"
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "warmup":
        return _warmup(args)
    if args.command == "vllm":
        return _vllm()
    from .demo import main as demo_main

    return demo_main(args.device)


def _shape(text: str):
    """``OUTxIN`` (``4096x12288``), IN optionally slice widths joined by ``+``."""
    try:
        out, _, inputs = text.lower().partition("x")
        widths = [int(w) for w in inputs.split("+")]
        return int(out), widths[0] if len(widths) == 1 else widths
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected OUTxIN, e.g. 4096x12288 or 4096x4096+4096+4096"
        ) from None


def _token_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected token counts like 1,2,4,8") from None


_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def _add_warmup(commands) -> None:
    warm = commands.add_parser(
        "warmup", help="compile the kernels of MXFP8 projections into the kernel cache"
    )
    warm.add_argument("shapes", nargs="+", type=_shape, metavar="OUTxIN",
                      help="weight shape; IN may be slice widths joined by +")  # fmt: skip
    warm.add_argument("--tokens", type=_token_list, default=None,
                      help="token counts, comma-separated (default: capture sizes)")  # fmt: skip
    warm.add_argument("--max-tokens", type=int, default=512,
                      help="largest default capture size (default: 512)")  # fmt: skip
    warm.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    warm.add_argument("--bias-dtype", choices=[*sorted(_DTYPES), "fp32", "none"], default="none")
    warm.add_argument("--activation", choices=["mxfp8", "bf16"], default="mxfp8",
                      help="mxfp8: W8A8 (the slices quantized); bf16: W8A16 (read as they are)")  # fmt: skip
    warm.add_argument("--workers", type=int, default=None,
                      help="parallel compile processes (default: CPU count, at most 16)")  # fmt: skip


def _warmup(args) -> int:
    import torch

    from .kernel_warmup import warmup

    bias = {"none": None, "fp32": "float32"}.get(args.bias_dtype, _DTYPES.get(args.bias_dtype))
    try:
        report = warmup(
            args.shapes, args.tokens, max_tokens=args.max_tokens,
            dtype=getattr(torch, _DTYPES[args.dtype]),
            bias_dtype=getattr(torch, bias) if bias else None, activation=args.activation,
            workers=args.workers,
        )  # fmt: skip
    except (TypeError, ValueError) as error:
        print(f"python -m mxfp8_fusion warmup: {error}", file=sys.stderr)
        return 2
    print(
        f"{report.builds} kernel builds ready in {report.seconds:.1f} s: "
        f"{report.compiled} compiled, {report.from_disk} read from the kernel cache"
    )
    return 0


def _vllm() -> int:
    import logging

    from .vllm.plugin import describe

    logging.disable(logging.WARNING)  # vLLM's import-time chatter; the report says it all
    text, on = describe()
    print(text)
    return 0 if on else 1


if __name__ == "__main__":
    sys.exit(main())
