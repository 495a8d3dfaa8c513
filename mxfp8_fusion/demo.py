"""The main job: a drafter-like projection over six concatenated hidden-state slices, run
concatenated and staged, checked bitwise equal, with the transient memory each needs; and the
same weight as W8A16 straight from the slices (no concatenation, no quantization)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import api
from .format import VALUE_DTYPE, scale_bytes
from .nn import MXFP8Linear
from .w8a16 import mm_slices


@dataclass(frozen=True)
class DemoConfig:
    """Geometry of the demo: ``slices`` hidden states of width ``hidden`` projected to ``hidden``."""

    tokens: int
    hidden: int
    slices: int = 6
    dtype: torch.dtype = torch.bfloat16

    @classmethod
    def for_device(cls, device: torch.device) -> DemoConfig:
        if device.type == "cuda":
            return cls(tokens=4096, hidden=7168)  # the benchmarks' reference geometry
        return cls(tokens=512, hidden=1024)  # seconds on two CPU cores


class Drafter(nn.Module):
    """``fc(cat([h1, ..., hn], -1))``: a speculative-decoding drafter's input projection."""

    def __init__(self, fc: nn.Module):
        super().__init__()
        self.fc = fc

    def forward(self, *hidden: Tensor) -> Tensor:
        return self.fc(torch.cat(hidden, dim=-1))


def make_drafter(
    cfg: DemoConfig, device: torch.device, seed: int = 0
) -> tuple[Drafter, list[Tensor]]:
    """A drafter with a random MXFP8 projection and random hidden-state slices."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = cfg.hidden * cfg.slices
    linear = nn.Linear(k, cfg.hidden, bias=True, dtype=cfg.dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(cfg.hidden, k, generator=gen) * k**-0.5)
        linear.bias.copy_(torch.randn(cfg.hidden, generator=gen) * 0.1)
    fc = MXFP8Linear.from_linear(linear.to(device))
    hidden = [
        torch.randn(cfg.tokens, cfg.hidden, generator=gen).to(device=device, dtype=cfg.dtype)
        for _ in range(cfg.slices)
    ]
    return Drafter(fc).eval(), hidden


def run_concatenated(model: Drafter, hidden: list[Tensor]) -> Tensor:
    return model(*hidden)


def run_staged(model: Drafter, hidden: list[Tensor]) -> Tensor:
    """The staged eager path: ``empty_input``, one ``quantize_input_slice`` per slice, then
    ``mm_quantized_into`` a fresh output."""
    fc = model.fc
    weight = fc.weight
    tokens, device, dtype = hidden[0].shape[0], hidden[0].device, hidden[0].dtype
    staged = api.empty_input(tokens, fc.in_features, device, dtype)
    column = 0
    for h in hidden:
        api.quantize_input_slice(h, staged, column)
        column += h.shape[1]
    out = torch.empty(tokens, fc.out_features, dtype=dtype, device=device)
    return api.mm_quantized_into(staged, weight, out, bias=fc.bias)


def run_w8a16(model: Drafter, hidden: list[Tensor]) -> Tensor:
    """W8A16 straight from the slices (``mm_slices``): nothing concatenated or quantized."""
    return mm_slices(hidden, model.fc.weight, bias=model.fc.bias)


def transient_bytes(fn, *args) -> int | None:
    """Peak bytes allocated by ``fn(*args)`` above what was allocated before (CUDA only)."""
    device = args[-1][0].device
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn(*args)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def computed_bytes(cfg: DemoConfig, concatenated: bool, quantized: bool = True) -> int:
    """Transient bytes from the shapes, where no allocator measures them (the CPU): the
    BF16 concatenation (concatenated paths only), the MXFP8 values and scales (W8A8 paths
    only), the output."""
    k = cfg.hidden * cfg.slices
    itemsize = torch.empty((), dtype=cfg.dtype).element_size()
    storage = cfg.tokens * k * torch.empty((), dtype=VALUE_DTYPE).element_size()
    storage += scale_bytes(cfg.tokens, k)
    out = cfg.tokens * cfg.hidden * itemsize
    cat = cfg.tokens * k * itemsize if concatenated else 0
    return cat + (storage if quantized else 0) + out


def compile_drafter(model: Drafter, hidden: list[Tensor]) -> tuple[object, int, int]:
    """``torch.compile(model, backend="mxfp8_fusion")``, compiled and warmed up on ``hidden``.

    Inductor's caches are off for this compile so that the pass runs (a cache hit would skip
    it) and its counts are real. Returns the compiled model and the sites rewritten/skipped.
    """
    import torch._dynamo.utils

    counts = torch._dynamo.utils.counters["mxfp8_fusion"]
    before = counts["sites_rewritten"], counts["sites_skipped"]
    compiled = torch.compile(model, backend="mxfp8_fusion")
    import torch._functorch.config

    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        compiled(*hidden)
    return (
        compiled,
        counts["sites_rewritten"] - before[0],
        counts["sites_skipped"] - before[1],
    )


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The demo's device: ``cpu``, ``cuda`` or ``cuda:N``; ``None`` is CUDA when present.

    Raises:
        TypeError: ``device`` is not a str, a ``torch.device`` or ``None``.
        ValueError: not a device name, a device type the demo does not run on, or a CUDA
            device this machine does not have.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a device name: use cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: the demo runs on cpu or cuda, not {dev.type}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r}: no CUDA device here (this torch has no CUDA, or no GPU "
                "is visible); use cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: there are {torch.cuda.device_count()} CUDA device(s) here"
            )
    return dev


_HOW = (
    "how: measured = the CUDA allocator's peak over the call; computed = from the shapes\n"
    "(no allocator to measure on a CPU): BF16 concatenation + MXFP8 values and scales (W8A8)\n"
    "+ output"
)


def main(device: str | torch.device | None = None) -> int:
    """Run the demo on ``device`` (see :func:`resolve_device`) and print what it finds.

    Returns:
        0 when the staged and compiled outputs are bitwise equal to the concatenated one and
        the compiled site was rewritten, else 1.

    Raises:
        TypeError, ValueError: a bad ``device``, as :func:`resolve_device` says.
    """
    dev = resolve_device(device)
    cfg = DemoConfig.for_device(dev)
    model, hidden = make_drafter(cfg, dev)
    backend = "GPU kernels where supported" if dev.type == "cuda" else "CPU reference"
    print(
        f"mxfp8_fusion demo on {dev} ({backend}): {cfg.slices} slices of "
        f"[{cfg.tokens}, {cfg.hidden}] {str(cfg.dtype).removeprefix('torch.')} "
        f"-> MXFP8 linear [{cfg.hidden * cfg.slices} -> {cfg.hidden}]"
    )
    with torch.no_grad():
        concatenated = run_concatenated(model, hidden)
        staged = run_staged(model, hidden)
        equal = torch.equal(concatenated.view(torch.int16), staged.view(torch.int16))
        compiled, rewritten, skipped = compile_drafter(model, hidden)
        compiled_out = compiled(*hidden)
        compiled_equal = torch.equal(concatenated.view(torch.int16), compiled_out.view(torch.int16))
        del compiled_out
        w8a16 = run_w8a16(model, hidden)
        # the same weight as a W8A16 layer on the concatenation
        w8a16_cat = mm_slices([torch.cat(hidden, -1)], model.fc.weight, bias=model.fc.bias)
        w8a16_equal = torch.equal(w8a16.view(torch.int16), w8a16_cat.view(torch.int16))
        del w8a16, w8a16_cat
        rows = [
            ("concatenated eager (cat + one-shot mm)", run_concatenated, True, True),
            ("staged eager (quantize_input_slice + mm_quantized_into)", run_staged, False, True),
            (
                'compiled, backend="mxfp8_fusion"',
                lambda m, h: compiled(*h),
                rewritten == 0,
                True,
            ),
            ("W8A16 eager from the slices (mm_slices)", run_w8a16, False, False),
        ]
        print(f"{'path':<56} {'transient bytes':>16}  how")
        for name, fn, is_cat, quantized in rows:
            measured = transient_bytes(fn, model, hidden)
            value, how = (
                (measured, "measured")
                if measured is not None
                else (computed_bytes(cfg, is_cat, quantized), "computed")
            )
            print(f"{name:<56} {value:>16,}  {how}")
        print(_HOW)
    print(f"staged == concatenated, bitwise: {equal}")
    print(
        f'torch.compile(backend="mxfp8_fusion"): {rewritten} cat site(s) rewritten, '
        f"{skipped} left unchanged"
    )
    print(f"compiled == concatenated, bitwise: {compiled_equal}")
    print(f"W8A16 from the slices == W8A16 on the concatenation, bitwise: {w8a16_equal}")
    return 0 if equal and compiled_equal and w8a16_equal and rewritten == 1 else 1
