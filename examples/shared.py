"""What every example does with its model: build it with random BF16 weights, convert it,
compile it with the ``mxfp8_fusion`` backend (``fullgraph=True``, the token dim dynamic),
report the pass's decision at every site, and compare the output with plain Inductor on the
same converted model, bit for bit.

The examples import this module from their own folder (``python examples/NAME.py`` puts
that folder first on ``sys.path``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

import mxfp8_fusion as mf


def command_line(doc: str, config_type):
    """The examples' command line (``--tokens``, ``--activation``, described by ``doc``'s
    first paragraph): ``(device, tokens, config, activation)``: CUDA where there is a GPU,
    with the real geometry (``config_type.real()``) and 4096 and 1000 tokens by default;
    else the CPU, the small geometry (``config_type()``) and 48 and 37 tokens; the
    activation ``convert`` gives the layers, W8A8 (``"mxfp8"``) by default."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=None)
    parser.add_argument(
        "--activation",
        choices=["mxfp8", "bf16"],
        default="mxfp8",
        help="mxfp8: W8A8, the slices quantized into MXFP8 storage (default); bf16: W8A16, "
        "the GEMM reads the BF16 slices as they are (vLLM's numerics on Hopper)",
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = config_type.real() if device.type == "cuda" else config_type()
    tokens = args.tokens or ([4096, 1000] if device.type == "cuda" else [48, 37])
    return device, tokens, cfg, args.activation


def random_bf16(model: nn.Module, device: torch.device | str) -> nn.Module:
    """``model`` with every weight matrix drawn from N(0, 1 / in_features), in BF16 on
    ``device``, in eval mode. (HF's own init is for training; this keeps activations O(1).)"""
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=p.shape[1] ** -0.5)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def sequence_inputs(count: int, hidden: int, tokens: int, device, seed: int) -> tuple:
    """``count`` random hidden states ``[1, tokens, hidden]`` (BF16, on ``device``), then the
    position ids ``[1, tokens]``: the inputs of one sequence of ``tokens``."""
    gen = torch.Generator().manual_seed(seed)
    states = [
        torch.randn(1, tokens, hidden, generator=gen).to(device, torch.bfloat16)
        for _ in range(count)
    ]
    return (*states, torch.arange(tokens, device=device).unsqueeze(0))


def convert_and_check(
    model: nn.Module, inputs_per_call, token_dims, activation: str = "mxfp8"
) -> None:
    """:func:`mxfp8_fusion.convert` ``model`` (its layers running ``activation``) and print
    how many linears it converted, then what :func:`check` finds."""
    report: dict[str, str] = {}
    mf.convert(model, report=report, activation=activation)
    print(f"converted {sum(v == 'converted' for v in report.values())} of {len(report)} linears")
    print(check(model, inputs_per_call, token_dims))


def mark_tokens_dynamic(inputs: Sequence[Tensor], token_dims: Sequence[int | None]) -> None:
    """Mark each input's token dim dynamic (``None``: leave that input static), so one
    compiled program serves every token count and feature widths stay static, as the pass
    needs them."""
    for x, dim in zip(inputs, token_dims, strict=True):
        if dim is not None:
            torch._dynamo.mark_dynamic(x, dim)


def compile_fused(model: nn.Module) -> nn.Module:
    """``model`` compiled with the fusion backend, the whole forward one graph."""
    return torch.compile(model, backend="mxfp8_fusion", fullgraph=True)


def compile_inductor(model: nn.Module) -> nn.Module:
    """``model`` compiled with plain Inductor (no pass): the program the pass rewrites."""
    return torch.compile(model, backend="inductor", fullgraph=True)


def bits(t: Tensor) -> Tensor:
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int16)


def bitwise_equal(a, b) -> bool:
    """Same shape, dtype and bytes (a tuple or list compared element by element)."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b, strict=True))
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


@dataclass
class Check:
    """What :func:`check` found: the pass's report and, per token count, the comparisons."""

    report: object
    tokens: list[int]
    output_bitwise: list[bool]
    projection_bitwise: list[bool]

    @property
    def rewritten(self) -> int:
        return len(self.report.rewritten)

    @property
    def ok(self) -> bool:
        """Every site rewritten, every output bitwise equal to plain Inductor's.

        The examples' slices are the drafter's inputs, so both programs quantize the same
        BF16 bytes; on a GPU, Inductor's timed choice of reduction configs can still change
        the layer's last bits between any two compiles (docs/performance.md, "Bits")."""
        return (
            not self.report.skipped
            and self.rewritten > 0
            and all(self.output_bitwise)
            and all(self.projection_bitwise)
        )

    def __str__(self) -> str:
        lines = [str(self.report)]
        for t, out, proj in zip(
            self.tokens, self.output_bitwise, self.projection_bitwise, strict=True
        ):
            lines.append(
                f"{t} tokens: bitwise equal to plain Inductor: output {out}, projection {proj}"
            )
        return "\n".join(lines)


def _run_all(compiled, inputs_per_call):
    outs = []
    for i, inputs in enumerate(inputs_per_call):
        # one compiled program for every token count: a second call must not recompile
        stance = "fail_on_recompile" if i else "default"
        with torch.compiler.set_stance(stance):
            outs.append(compiled(*inputs))
    return outs


def check(
    model: nn.Module,
    inputs_per_call: Sequence[Sequence[Tensor]],
    token_dims: Sequence[int | None],
) -> Check:
    """Explain ``model`` on the first inputs, then run it compiled with the fusion backend
    and with plain Inductor on each inputs in turn (different token counts: compiled once,
    never recompiled) and compare.

    ``model(*inputs)`` returns ``(output, projection)``: the layer's output and the
    projection site's output, both compared bit for bit.
    """
    first = inputs_per_call[0]
    for inputs in inputs_per_call:
        mark_tokens_dynamic(inputs, token_dims)
    with torch.no_grad():
        torch._dynamo.reset()
        report = mf.explain(model, *first)
        torch._dynamo.reset()
        fused = _run_all(compile_fused(model), inputs_per_call)
        torch._dynamo.reset()
        plain = _run_all(compile_inductor(model), inputs_per_call)
        torch._dynamo.reset()
    tokens = [int(inputs[0].shape[token_dims[0]]) for inputs in inputs_per_call]
    return Check(
        report,
        tokens,
        [bitwise_equal(f[0], p[0]) for f, p in zip(fused, plain, strict=True)],
        [bitwise_equal(f[1], p[1]) for f, p in zip(fused, plain, strict=True)],
    )
