"""CuTe DSL slice quantizer: BF16/FP16 ``[tokens, width]`` -> MXFP8 columns of a destination.

Layers: the kernel (``quantize.kernel``: the ``@cute.jit`` entry and ``@cute.kernel``
body) -> :func:`compile_kernel` (one build per :class:`QuantizerConfig`, kept by the launcher
in memory and on disk: launcher.py) -> :func:`run_if_served` (what the ops call: checks and
launches in one pass over the call's facts), with :func:`refusal` and :func:`run` as its two
halves for tests and benchmarks. The ``*_many`` functions quantize up to 8 equal-shape slices in one launch
(the same tile code; one launch instead of six removes the gaps between kernels). The config,
tile shapes and grid both sides read are in ``quantize.geometry``.

Work split. A CTA of 256 threads quantizes a tile of ``rows`` rows x ``blocks`` column tiles
of 128 columns (4 scale groups each). 16 threads cover 128 columns of one row, each loading
8 halves with one 16-byte load, so 4 threads share a 32-element group and combine their
block maxima with two butterfly shuffles. Each thread issues all its loads (``rows / 16``
rows x ``blocks`` column tiles) before it computes, to keep several 16-byte loads in flight,
then writes 8 E4M3 bytes per row and column tile with one 8-byte store; the first thread of
each group writes the scale byte into the blocked layout.

Only tiles holding live rows (``< tokens``) are launched. Every tile but the last row tile is
all live and runs without guards. The last row tile skips the 16-row passes whose warp holds
no live row (the condition is warp-uniform, so the shuffles stay convergent) and writes the
padding scale bytes: 127 for every row in ``[tokens, roundup(tokens, 128))`` of its column
tiles' 512-byte chunks, as coalesced byte stores; values of padding rows are not written
(the reference writes none either). So a call's loads and conversions grow with its live
rows (in steps of a warp's two rows), not with the 128-row boundary.

Two tile shapes are compiled into one kernel and chosen per launch from ``tokens`` (a
CTA-uniform branch): up to ``small_tokens`` tokens, a 16-row tile over 4 column tiles (a
quarter of the CTAs, each thread still 4 loads deep), otherwise ``tile_rows`` x 1.

Launches use programmatic dependent launch (``QuantizerConfig.pdl``): a launch's CTAs may be
scheduled while the previous kernel's last ones run, and wait for it to finish before they
read anything, so back-to-back slice launches lose less between kernels. While they wait,
the first CTAs prefetch their source lines into L2 (``QuantizerConfig.prefetch``). The measurements are in
docs/quantize_log.md.

Everything the call can change (tokens, the source row stride, the destination width K, the
column, the three addresses) is a runtime argument, so one compile serves every call of a
(dtype, width, tile, slices, arch) combination, and a call neither syncs nor allocates (CUDA
Graph safe).

Targets (:data:`ARCHS`): the kernel is plain SIMT code. Its PTX needs sm_90 or later
(``griddepcontrol`` for programmatic dependent launch, ``max.u16x2``) and sm_89 or later
(``cvt.rn.satfinite.e4m3x2``), and uses none of Hopper's own machinery (no wgmma, TMA,
mbarriers or clusters), so the same source builds for Hopper and for Blackwell. An
arch-specific (``a``) binary runs only on its own arch, so each capability has its own build,
chosen from the device's capability; the arch is a compile-time fact of the config.
"""

import functools

import torch

from ...format import GROUP, group_blocks, padded_rows
from ..runtime import launcher
from ..runtime.launcher import int32, pointer, raw_stream
from .geometry import (
    ARCHS,
    DEFAULT_ARCH,
    DEFAULT_TILE_ROWS,
    MAX_SLICES,
    SMALL_TOKENS,
    TILE_COLS,
    QuantizerConfig,
    check_config,
)


def compile_args(config: QuantizerConfig) -> tuple:
    """Compile-time placeholders of the kernel's arguments (see launcher.compile_kernel).

    One slice: source, values, scales, tokens, source row stride, values row stride (K),
    column, scale chunk groups. Several: values, scales, tokens, K, scale chunk groups, then
    8 slots each of sources, row strides and columns, those past ``config.slices`` None.
    """
    source = pointer("Float16" if config.fp16 else "BFloat16", 16)
    values, scales = pointer("Float8E4M3FN", 8), pointer("Uint8", 1)
    if config.slices == 1:
        return (source, values, scales, *(int32() for _ in range(5)))
    absent = (None,) * (MAX_SLICES - config.slices)
    return (
        values, scales, int32(), int32(), int32(),
        *(source,) * config.slices, *absent,
        *(int32() for _ in range(config.slices)), *absent,
        *(int32() for _ in range(config.slices)), *absent,
    )  # fmt: skip


def compile_kernel(config: QuantizerConfig):
    """Compile the kernel for ``config`` and its ``arch`` (works without a GPU; a binary for
    another arch than the DSL's runtime one can be inspected but not launched).

    Raises ``ValueError`` for an invalid config and ``ImportError`` without nvidia-cutlass-dsl.
    """
    from .kernel import build

    check_config(config)
    return launcher.compile_kernel(build(config), compile_args(config), config.arch)


def build_of(config: QuantizerConfig) -> launcher.Build:
    """The kernel binary ``config`` names (see launcher.Build)."""
    return launcher.Build("quantizer", (config,), config.arch, compile_kernel)


def builds(fp16: bool, widths, arch: str) -> list[launcher.Build]:
    """The builds that quantizing slices of ``widths`` columns (FP16 sources where ``fp16``)
    launches on ``arch``: one launch of them all where they share a width and are at most
    MAX_SLICES (:func:`run_many`, as the ops call it), else one launch per slice."""
    widths = list(widths)
    if len(set(widths)) == 1 and len(widths) <= MAX_SLICES:
        return [build_of(config_of(fp16, widths[0], len(widths), arch))]
    return list(dict.fromkeys(build_of(config_of(fp16, w, 1, arch)) for w in widths))


def arch_for(capability: tuple[int, int]) -> str | None:
    """The build target for a GPU of compute ``capability`` (major, minor); None where the
    kernel is not built for it."""
    return ARCHS.get(tuple(capability))


def _device_arch(t: torch.Tensor) -> str:
    cap = torch.cuda.get_device_capability(_device_index(t))
    arch = arch_for(cap)
    if arch is None:
        raise ValueError(
            f"the slice quantizer is not built for sm_{cap[0]}{cap[1]} "
            f"(built for {', '.join(ARCHS.values())})"
        )
    return arch


def config_for(
    source: torch.Tensor,
    tile_rows: int = DEFAULT_TILE_ROWS,
    slices: int = 1,
    small_tokens: int = SMALL_TOKENS,
    pdl: bool = True,
    prefetch: bool = True,
    arch: str = DEFAULT_ARCH,
) -> QuantizerConfig:
    """The compile-time facts of a call (the token count is not one of them)."""
    fp16 = source.dtype == torch.float16
    width = source.shape[1]
    return _cached_config(fp16, width, tile_rows, slices, small_tokens, pdl, prefetch, arch)


def config_of(fp16: bool, width: int, slices: int, arch: str) -> QuantizerConfig:
    """The config the ops launch for ``slices`` slices of ``width`` columns (FP16 sources
    where ``fp16``, else BF16) on ``arch``: the default tiles."""
    return _cached_config(fp16, width, DEFAULT_TILE_ROWS, slices, SMALL_TOKENS, True, True, arch)


# One instance per set of facts, made once: building a frozen dataclass per call costs more
# than looking it up by a plain tuple.
_cached_config = functools.cache(QuantizerConfig)


_SOURCE_DTYPES = (torch.bfloat16, torch.float16)


def _row_stride_or_refusal(source: torch.Tensor, values: torch.Tensor, column: int) -> int | str:
    """``source``'s row stride where :func:`run` serves the call, else a sentence saying why
    not: the checks of :func:`refusal` in one pass that also yields what the launch needs
    (an eager call pays each tensor attribute read once)."""
    if source.dtype not in _SOURCE_DTYPES or source.dim() != 2 or values.dim() != 2:
        return "the source must be a 2-D BF16 or FP16 tensor and the values 2-D"
    if values.dtype != torch.float8_e4m3fn or not values.is_contiguous():
        return "the values must be a contiguous float8_e4m3fn tensor"
    tokens, width = source.shape
    k = values.shape[1]
    if width == 0 or width % TILE_COLS or column % TILE_COLS or column + width > k:
        return f"width {width} and column {column} must be multiples of {TILE_COLS} within K={k}"
    row, unit = source.stride()
    if tokens > values.shape[0] or unit != 1:
        return "the source must have unit column stride and no more rows than the values"
    if padded_rows(tokens) // DEFAULT_TILE_ROWS > 65535:  # grid.y limit
        return f"{tokens} tokens are more than one launch's grid holds"
    src_ld = row if tokens > 1 else width
    if src_ld % 8 or src_ld < width or source.data_ptr() % 16:
        return "the source's rows must start 16-byte aligned"
    if k % 8 or values.data_ptr() % 8 or source.device != values.device:
        return "the values' rows must start 8-byte aligned, on the source's device"
    return src_ld


def refusal(source: torch.Tensor, values: torch.Tensor, column: int) -> str | None:
    """Why :func:`run` does not serve this call, None where it does: layout and alignment
    facts only, no compile.

    Needs a BF16/FP16 source with unit column stride, width a multiple of 128, 16-byte
    aligned rows (data pointer and row stride), a contiguous E4M3 destination with 8-byte
    aligned rows, and a column that is a multiple of 128 inside the destination.
    """
    served = _row_stride_or_refusal(source, values, column)
    return served if isinstance(served, str) else None


def _launch(config: QuantizerConfig, args: tuple) -> None:
    launcher.launch(build_of(config), args)


def _device_index(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _row_stride(source: torch.Tensor) -> int:
    return source.stride(0) if source.shape[0] > 1 else source.shape[1]


def run(
    source: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    column: int,
    tile_rows: int = DEFAULT_TILE_ROWS,
    small_tokens: int = SMALL_TOKENS,
    pdl: bool = True,
    prefetch: bool = True,
    arch: str | None = None,
) -> None:
    """Quantize ``source`` into ``values[:tokens, column:column+width]`` and its scales.

    Same contract and bytes as ``mxfp8_fusion.reference.quantize_slice_``; only where
    :func:`refusal` has no reason. Launches on the current stream; no sync, no allocation.
    ``tile_rows`` and ``small_tokens`` select the compiled tile shapes (benchmarks, tests);
    every choice writes the same bytes. ``pdl`` launches with programmatic dependent launch:
    the grid may be scheduled while the previous kernel's last CTAs run and waits for that
    kernel's completion before it reads anything, so stream order is kept while the launch
    latency between back-to-back kernels is hidden (``False``: plain launch, benchmarks).
    ``prefetch`` (with ``pdl``): before that wait, each CTA pulls its source lines into L2.
    ``arch``: the build target, by default the one of ``source``'s GPU (ValueError where
    there is none).
    """
    arch = arch or _device_arch(source)
    config = config_for(source, tile_rows, 1, small_tokens, pdl, prefetch, arch)
    _launch_one(config, source, values, scales, column, _row_stride(source))


def run_if_served(
    source: torch.Tensor,
    values: torch.Tensor,
    scales: torch.Tensor,
    column: int,
    arch: str | None = None,
) -> str | None:
    """:func:`run` with the default tiles where :func:`refusal` has no reason: None once
    launched, else the reason (nothing launched). The eager and compiled calls' one entry
    point; they pass ``arch`` (the device's build target, looked up once per call by the
    dispatcher)."""
    src_ld = _row_stride_or_refusal(source, values, column)
    if isinstance(src_ld, str):
        return src_ld
    config = config_for(source, arch=arch or _device_arch(source))
    _launch_one(config, source, values, scales, column, src_ld)
    return None


def _launch_one(config: QuantizerConfig, source, values, scales, column: int, src_ld: int) -> None:
    k = values.shape[1]
    args = (
        source.data_ptr(),
        values.data_ptr(),
        scales.data_ptr(),
        source.shape[0],
        src_ld,
        k,
        column,
        group_blocks(k // GROUP),
        raw_stream(_device_index(source)),
    )
    _launch(config, args)


def _row_strides_or_refusal(sources, values: torch.Tensor, columns) -> list[int] | str:
    """Each slice's row stride where :func:`run_many` serves the call, else why not."""
    if not 1 <= len(sources) <= MAX_SLICES or len(columns) != len(sources):
        return f"one launch takes 1 to {MAX_SLICES} slices, each with a column"
    first = sources[0]
    first_ld = _row_stride_or_refusal(first, values, columns[0])
    if isinstance(first_ld, str):
        return first_ld
    # the rest share the first's dtype and shape, so the facts checked above on it hold for
    # them too: only each one's own layout, pointer, column and device remain
    strides = [first_ld]
    dtype, shape, k, device = first.dtype, first.shape, values.shape[1], first.device
    tokens, width = shape
    for source, column in zip(sources[1:], columns[1:], strict=True):
        if source.dtype != dtype or source.shape != shape:
            return "the slices must share one dtype and shape"
        row, unit = source.stride()
        src_ld = row if tokens > 1 else width
        if unit != 1 or src_ld % 8 or src_ld < width or source.data_ptr() % 16:
            return "every slice's rows must start 16-byte aligned"
        if column % TILE_COLS or column + width > k or source.device != device:
            return f"every column must be a multiple of {TILE_COLS} within K, on one device"
        strides.append(src_ld)
    return strides


def refusal_many(sources, values: torch.Tensor, columns) -> str | None:
    """Why :func:`run_many` does not serve this call, None where it does: it takes 1 to 8
    slices of one dtype, one width and one token count, each one :func:`run` serves."""
    served = _row_strides_or_refusal(sources, values, columns)
    return served if isinstance(served, str) else None


def run_many(
    sources,
    values: torch.Tensor,
    scales: torch.Tensor,
    columns,
    tile_rows: int = DEFAULT_TILE_ROWS,
    small_tokens: int = SMALL_TOKENS,
    pdl: bool = True,
    prefetch: bool = True,
    arch: str | None = None,
) -> None:
    """:func:`run` for several equal-shape slices in one launch (where :func:`refusal_many`
    has no reason).

    Slice ``i`` goes to columns ``[columns[i], columns[i] + width)``; the bytes written are
    exactly those of calling :func:`run` once per slice.
    """
    arch = arch or _device_arch(sources[0])
    config = config_for(sources[0], tile_rows, len(sources), small_tokens, pdl, prefetch, arch)
    _launch_many(config, sources, values, scales, columns, [_row_stride(s) for s in sources])


def run_many_if_served(
    sources, values: torch.Tensor, scales: torch.Tensor, columns, arch: str | None = None
) -> str | None:
    """:func:`run_many` with the default tiles where :func:`refusal_many` has no reason:
    None once launched, else the reason (nothing launched)."""
    strides = _row_strides_or_refusal(sources, values, columns)
    if isinstance(strides, str):
        return strides
    config = config_for(sources[0], slices=len(sources), arch=arch or _device_arch(sources[0]))
    _launch_many(config, sources, values, scales, columns, strides)
    return None


def _launch_many(config: QuantizerConfig, sources, values, scales, columns, strides) -> None:
    if config.slices == 1:  # the one-slice kernel: its own argument list
        _launch_one(config, sources[0], values, scales, columns[0], strides[0])
        return
    k = values.shape[1]
    absent = (None,) * (MAX_SLICES - len(sources))
    args = (
        values.data_ptr(),
        scales.data_ptr(),
        sources[0].shape[0],
        k,
        group_blocks(k // GROUP),
        *[s.data_ptr() for s in sources],
        *absent,
        *strides,
        *absent,
        *columns,
        *absent,
        raw_stream(_device_index(sources[0])),
    )
    _launch(config, args)
