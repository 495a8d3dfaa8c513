"""CuTe DSL slice quantizer: BF16/FP16 ``[tokens, width]`` -> MXFP8 columns of a destination.

Layers: :class:`_SliceQuantizer` (the ``@cute.jit`` launcher and ``@cute.kernel`` body) ->
:func:`_compiled` (one compile per :class:`_Config`, cached on compile-time facts only) ->
:func:`run` (the in-place op the dispatcher calls) and :func:`supported` (its predicate).
:func:`run_many` / :func:`supported_many` quantize up to 8 equal-shape slices in one launch
(the same tile code; one launch instead of six removes the gaps between kernels).

Work split. A CTA of 256 threads quantizes a tile of ``tile_rows`` rows x 128 columns
(4 scale groups). 16 threads cover one row of the tile, each loading 8 halves with one
16-byte load, so 4 threads share a 32-element group and combine their block maxima with two
butterfly shuffles. Each thread issues all its loads (``tile_rows / 16`` rows) before it
computes, to keep several 16-byte loads in flight, then writes 8 E4M3 bytes per row with one
8-byte store; the first thread of each group writes the scale byte into the blocked layout.
Rows past ``tokens`` (up to the next multiple of 128) only get the padding scale byte 127;
they load the last live row instead of branching around the load.

Everything the call can change (tokens, the source row stride, the destination width K, the
column, the three addresses) is a runtime argument, so one compile serves every call of a
(dtype, width, tile) combination, and a call neither syncs nor allocates (CUDA Graph safe).
"""

import ctypes
import threading
from dataclasses import dataclass

import torch

_GROUP = 32
_TILE_COLS = 128  # one 512-byte scale chunk column: 4 groups
_THREADS = 256
_THREADS_PER_ROW = _TILE_COLS // 8  # 16-byte loads of 8 halves
_ROWS_PER_PASS = _THREADS // _THREADS_PER_ROW  # 16

# Rows per CTA tile. 64 rows = 4 loads of 16 bytes in flight per thread and 3584 CTAs for one
# 4096 x 7168 slice. H200, six such slices, six launches (benchmarks/quantize_slice.py --tiles):
# 32 rows 0.1614 ms, 64 rows 0.1621 ms, 128 rows 0.1645 ms, 16 rows 0.1665 ms; 32 and 64 are
# within run-to-run noise (see benchmarks/QUANTIZE_LOG.md).
DEFAULT_TILE_ROWS = 64


@dataclass(frozen=True)
class _Config:
    """Compile-time facts of one kernel: source dtype, slice width, tile height, and how many
    equal-width slices one launch quantizes (1 for :func:`run`, up to 8 for
    :func:`run_many`)."""

    fp16: bool
    width: int
    tile_rows: int = DEFAULT_TILE_ROWS
    slices: int = 1


MAX_SLICES = 8

# Scalar arguments of the two launchers, in order: q = 64-bit, i = 32-bit (then the stream).
#   one slice:  src, dst, scales, tokens, src_ld, dst_ld, column, scale_g4
#   many:       dst, scales, tokens, dst_ld, scale_g4, src[8], src_ld[8], column[8]
_ONE_KINDS = "qqqiiiii"
_MANY_KINDS = "qqiii" + "q" * MAX_SLICES + "i" * (2 * MAX_SLICES)


def _kinds(config: _Config) -> str:
    return _ONE_KINDS if config.slices == 1 else _MANY_KINDS


def _check_config(config: _Config) -> None:
    if config.width % _TILE_COLS or config.width <= 0:
        raise ValueError(f"width must be a positive multiple of 128, got {config.width}")
    if config.tile_rows not in (16, 32, 64, 128):
        raise ValueError(f"tile_rows must be one of 16, 32, 64, 128, got {config.tile_rows}")
    if not 1 <= config.slices <= MAX_SLICES:
        raise ValueError(f"slices must be in [1, {MAX_SLICES}], got {config.slices}")


def _build(config: _Config):
    """Define the kernel class (needs cutlass; imported here so the module never does)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64, Uint8, Uint32

    from . import quantize_ptx as ptx

    loads = config.tile_rows // _ROWS_PER_PASS
    fp16 = config.fp16
    width = config.width
    tile_rows = config.tile_rows
    slices = config.slices
    blocks = width // _TILE_COLS  # column tiles per slice
    gmem = cute.AddressSpace.gmem

    @cute.jit
    def quantize_tile(src_addr, src_ld, column, bx, by, dst_addr, scale_addr, tokens, dst_ld, g4):
        """One tile_rows x 128 tile: column tile ``bx`` of the slice, row tile ``by``."""
        tidx, _, _ = cute.arch.thread_idx()
        tx = tidx % _THREADS_PER_ROW
        ty = tidx // _THREADS_PER_ROW
        col = bx * _TILE_COLS + tx * 8  # first of this thread's 8 columns in the slice
        last = tokens - 1
        # Source and destination row strides are multiples of 8 elements (checked by
        # supported()), so every 16-byte load and 8-byte store below is aligned.
        src_ld8 = cute.assume(Int64(src_ld), divby=8)
        dst_ld8 = cute.assume(Int64(dst_ld), divby=8)
        dst_col = Int64(column + col)

        words = []
        for i in cutlass.range_constexpr(loads):
            row = by * tile_rows + ty + i * _ROWS_PER_PASS
            load_row = cutlass.min(row, last)
            offset = Int64(load_row) * src_ld8 + Int64(col)
            ptr = cute.make_ptr(Uint32, src_addr + offset * 2, gmem, assumed_align=16)
            frag = cute.make_rmem_tensor((4,), Uint32)
            cute.autovec_copy(cute.make_tensor(ptr, cute.make_layout(4)), frag)
            words.append(frag)

        # Blocked scale layout: this thread's group is g = column/32 + 4*bx + tx/4, so
        # g % 4 = tx // 4 and g // 4 = column/128 + bx (column is a multiple of 128).
        chunk_col = Int64(column // _TILE_COLS + bx) * 512
        for i in cutlass.range_constexpr(loads):
            row = by * tile_rows + ty + i * _ROWS_PER_PASS
            w = words[i]
            amax = ptx.magnitude_max4(w[0], w[1], w[2], w[3])
            amax = ptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
            amax = ptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2))
            byte = ptx.scale_byte(amax, fp16)
            out = cute.make_rmem_tensor((2,), Uint32)
            if byte < ptx.BYTE_INF:
                recip = ptx.reciprocal_bits(byte)
                out[0] = Uint32(ptx.quantize4(w[0], w[1], recip, fp16))
                out[1] = Uint32(ptx.quantize4(w[2], w[3], recip, fp16))
            else:
                out[0] = Uint32(ptx.quantize4_special(w[0], w[1], byte, fp16))
                out[1] = Uint32(ptx.quantize4_special(w[2], w[3], byte, fp16))
            if row < tokens:
                doffset = Int64(row) * dst_ld8 + dst_col
                dptr = cute.make_ptr(Uint32, dst_addr + doffset, gmem, assumed_align=8)
                cute.autovec_copy(out, cute.make_tensor(dptr, cute.make_layout(2)))
            if tx % 4 == 0:
                sbyte = cutlass.select_(row < tokens, byte, 127)
                soffset = (
                    chunk_col
                    + Int64(row // 128) * Int64(g4) * 512
                    + Int64((row % 32) * 16 + ((row // 32) % 4) * 4 + tx // 4)
                )
                sptr = cute.make_ptr(Uint8, scale_addr + soffset, gmem, assumed_align=1)
                stensor = cute.make_tensor(sptr, cute.make_layout(1))
                stensor[0] = Uint8(Int32(sbyte))

    def grid(tokens):
        return [slices * blocks, (tokens + 127) // 128 * (128 // tile_rows), 1]

    class _SliceQuantizer:
        @cute.jit
        def __call__(
            self,
            src_addr: Int64,
            dst_addr: Int64,
            scale_addr: Int64,
            tokens: Int32,
            src_ld: Int32,
            dst_ld: Int32,
            column: Int32,
            scale_g4: Int32,
            stream,
        ):
            self.kernel(
                src_addr, dst_addr, scale_addr, tokens, src_ld, dst_ld, column, scale_g4
            ).launch(grid=grid(tokens), block=[_THREADS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(
            self,
            src_addr: Int64,
            dst_addr: Int64,
            scale_addr: Int64,
            tokens: Int32,
            src_ld: Int32,
            dst_ld: Int32,
            column: Int32,
            scale_g4: Int32,
        ):
            bx, by, _ = cute.arch.block_idx()
            quantize_tile(
                src_addr, src_ld, column, bx, by, dst_addr, scale_addr, tokens, dst_ld, scale_g4
            )

    class _ManySliceQuantizer:
        """One launch for up to 8 equal-width slices: grid.x runs over (slice, column tile).

        Slice descriptors are 8 fixed scalar slots (address, row stride, column); slots past
        ``slices`` are never read. H200, six 4096 x 7168 slices: 0.132 ms (0.98 of the copy
        bandwidth) against 0.162 ms for six launches; at 1-128 tokens 4.5-4.9 us of GPU time
        against 11.6-12.7 us for six launches.
        """

        @cute.jit
        def __call__(
            self,
            dst_addr: Int64,
            scale_addr: Int64,
            tokens: Int32,
            dst_ld: Int32,
            scale_g4: Int32,
            a0: Int64, a1: Int64, a2: Int64, a3: Int64,
            a4: Int64, a5: Int64, a6: Int64, a7: Int64,
            l0: Int32, l1: Int32, l2: Int32, l3: Int32,
            l4: Int32, l5: Int32, l6: Int32, l7: Int32,
            c0: Int32, c1: Int32, c2: Int32, c3: Int32,
            c4: Int32, c5: Int32, c6: Int32, c7: Int32,
            stream,
        ):  # fmt: skip
            self.kernel(
                dst_addr, scale_addr, tokens, dst_ld, scale_g4,
                a0, a1, a2, a3, a4, a5, a6, a7,
                l0, l1, l2, l3, l4, l5, l6, l7,
                c0, c1, c2, c3, c4, c5, c6, c7,
            ).launch(grid=grid(tokens), block=[_THREADS, 1, 1], stream=stream)  # fmt: skip

        @cute.kernel
        def kernel(
            self,
            dst_addr: Int64,
            scale_addr: Int64,
            tokens: Int32,
            dst_ld: Int32,
            scale_g4: Int32,
            a0: Int64, a1: Int64, a2: Int64, a3: Int64,
            a4: Int64, a5: Int64, a6: Int64, a7: Int64,
            l0: Int32, l1: Int32, l2: Int32, l3: Int32,
            l4: Int32, l5: Int32, l6: Int32, l7: Int32,
            c0: Int32, c1: Int32, c2: Int32, c3: Int32,
            c4: Int32, c5: Int32, c6: Int32, c7: Int32,
        ):  # fmt: skip
            addrs = [a0, a1, a2, a3, a4, a5, a6, a7]
            lds = [l0, l1, l2, l3, l4, l5, l6, l7]
            cols = [c0, c1, c2, c3, c4, c5, c6, c7]
            bx, by, _ = cute.arch.block_idx()
            s = bx // blocks
            src_addr, src_ld, column = addrs[0], lds[0], cols[0]
            for j in cutlass.range_constexpr(1, slices):
                pick = s == j
                src_addr = Int64(cutlass.select_(pick, addrs[j], src_addr))
                src_ld = Int32(cutlass.select_(pick, lds[j], src_ld))
                column = Int32(cutlass.select_(pick, cols[j], column))
            quantize_tile(
                src_addr, src_ld, column, bx - s * blocks, by,
                dst_addr, scale_addr, tokens, dst_ld, scale_g4,
            )  # fmt: skip

    return _SliceQuantizer() if slices == 1 else _ManySliceQuantizer()


_cache: dict[_Config, object] = {}
_lock = threading.Lock()


def _compiled(config: _Config):
    """The compiled kernel for ``config``; compiles at most once per config per process."""
    fn = _cache.get(config)
    if fn is None:
        with _lock:
            fn = _cache.get(config)
            if fn is None:
                fn = compile_kernel(config)
                _cache[config] = fn
    return fn


def compile_kernel(config: _Config):
    """Compile the kernel for ``config`` (works without a GPU under ``CUTE_DSL_ARCH``).

    Raises ``ValueError`` for an invalid config and ``ImportError`` without nvidia-cutlass-dsl.
    """
    _check_config(config)
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    kernel = _build(config)
    fake = {"q": cutlass.Int64(0), "i": cutlass.Int32(1)}
    args = [fake[kind] for kind in _kinds(config)]
    return cute.compile(kernel, *args, make_fake_stream())


def config_for(source: torch.Tensor, tile_rows: int = DEFAULT_TILE_ROWS) -> _Config:
    """The compile-time facts of a call."""
    return _Config(source.dtype == torch.float16, source.shape[1], tile_rows)


_SOURCE_DTYPES = (torch.bfloat16, torch.float16)


def supported(source: torch.Tensor, values: torch.Tensor, column: int) -> bool:
    """Whether :func:`run` serves this call: layout and alignment facts only, no compile.

    Needs a BF16/FP16 source with unit column stride, width a multiple of 128, 16-byte
    aligned rows (data pointer and row stride), a contiguous E4M3 destination with 8-byte
    aligned rows, and a column that is a multiple of 128 inside the destination.
    """
    if source.dtype not in _SOURCE_DTYPES or source.dim() != 2 or values.dim() != 2:
        return False
    if values.dtype != torch.float8_e4m3fn or not values.is_contiguous():
        return False
    tokens, width = source.shape
    k = values.shape[1]
    if width == 0 or width % _TILE_COLS or column % _TILE_COLS or column + width > k:
        return False
    if tokens > values.shape[0] or source.stride(1) != 1:
        return False
    if (tokens + 127) // 128 * (128 // DEFAULT_TILE_ROWS) > 65535:  # grid.y limit
        return False
    src_ld = source.stride(0) if tokens > 1 else width
    if src_ld % 8 or src_ld < width or source.data_ptr() % 16:
        return False
    if k % 8 or values.data_ptr() % 8:
        return False
    return source.device == values.device


def _raw_stream(device_index: int) -> int:
    # The raw handle of the current stream without building a torch.cuda.Stream object
    # (Inductor's generated code reads it the same way).
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class _Launcher:
    """Launches one compiled kernel on one device with reusable argument buffers.

    The DSL's generic call path converts every argument on every call (about 80 us per
    launch measured on the H200 host, which made six small launches host-bound; 13 us with
    this launcher). The kernels take only scalars, so their C storage is allocated once here
    and refilled per call; the compiled executor then launches from the same pointers. The
    layout is checked once against the DSL's own marshalling; if it ever differs, the
    generic path is used.
    """

    def __init__(self, compiled, kinds: str, probe_args: tuple) -> None:
        self._compiled = compiled
        self._lock = threading.Lock()
        ctype = {"q": ctypes.c_int64, "i": ctypes.c_int32}
        self._slots = [ctype[kind]() for kind in kinds]
        self._stream = ctypes.c_uint64()
        self._args = [ctypes.c_void_p(ctypes.addressof(v)) for v in self._slots]
        self._args.append(ctypes.addressof(self._stream))
        self._executor = None
        try:
            import cuda.bindings.driver as cuda

            probe = (*probe_args[:-1], cuda.CUstream(probe_args[-1]))
            generic, _ = compiled.execution_args.generate_execution_args(probe, {})
            if self._same_layout(generic, probe_args):
                self._executor = compiled.to(None)
        except Exception:  # any internal change: keep the generic path
            self._executor = None

    def _same_layout(self, generic: list, probe_args: tuple) -> bool:
        if len(generic) != len(self._slots) + 1 or isinstance(generic[-1], ctypes.c_void_p):
            return False
        for slot, arg, value in zip(self._slots, generic, probe_args, strict=False):
            if type(slot).from_address(arg.value).value != value:
                return False
        return ctypes.c_uint64.from_address(generic[-1]).value == probe_args[-1]

    def __call__(self, args: tuple) -> None:
        if self._executor is None:
            import cuda.bindings.driver as cuda

            self._compiled(*args[:-1], cuda.CUstream(args[-1]))
            return
        with self._lock:
            for slot, value in zip(self._slots, args, strict=False):
                slot.value = value
            self._stream.value = args[-1]
            self._executor.run_compiled_program(self._args)


_launchers: dict[tuple, _Launcher] = {}


def _launch(config: _Config, device: int, args: tuple) -> None:
    launcher = _launchers.get((config, device))
    if launcher is None:
        compiled = _compiled(config)
        with _lock:
            launcher = _launchers.get((config, device))
            if launcher is None:
                with torch.cuda.device(device):
                    launcher = _Launcher(compiled, _kinds(config), args)
                _launchers[(config, device)] = launcher
    launcher(args)


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
) -> None:
    """Quantize ``source`` into ``values[:tokens, column:column+width]`` and its scales.

    Same contract and bytes as ``mxfp8_fusion.reference.quantize_slice_``; only where
    :func:`supported` holds. Launches on the current stream; no sync, no allocation.
    """
    k = values.shape[1]
    device = _device_index(source)
    args = (
        source.data_ptr(),
        values.data_ptr(),
        scales.data_ptr(),
        source.shape[0],
        _row_stride(source),
        k,
        column,
        (k // _GROUP + 3) // 4,
        _raw_stream(device),
    )
    _launch(config_for(source, tile_rows), device, args)


def supported_many(sources, values: torch.Tensor, columns) -> bool:
    """Whether :func:`run_many` serves this call: 1 to 8 slices of one dtype, one width and
    one token count, each one :func:`supported`."""
    if not 1 <= len(sources) <= MAX_SLICES or len(columns) != len(sources):
        return False
    first = sources[0]
    for source, column in zip(sources, columns, strict=True):
        if source.dtype != first.dtype or source.shape != first.shape:
            return False
        if not supported(source, values, column):
            return False
    return True


def run_many(
    sources,
    values: torch.Tensor,
    scales: torch.Tensor,
    columns,
    tile_rows: int = DEFAULT_TILE_ROWS,
) -> None:
    """:func:`run` for several equal-shape slices in one launch (where :func:`supported_many`).

    Slice ``i`` goes to columns ``[columns[i], columns[i] + width)``; the bytes written are
    exactly those of calling :func:`run` once per slice.
    """
    k = values.shape[1]
    device = _device_index(sources[0])
    pad = MAX_SLICES - len(sources)
    args = (
        values.data_ptr(),
        scales.data_ptr(),
        sources[0].shape[0],
        k,
        (k // _GROUP + 3) // 4,
        *[s.data_ptr() for s in sources],
        *[0] * pad,
        *[_row_stride(s) for s in sources],
        *[0] * pad,
        *columns,
        *[0] * pad,
        _raw_stream(device),
    )
    config = _Config(
        sources[0].dtype == torch.float16, sources[0].shape[1], tile_rows, len(sources)
    )
    _launch(config, device, args)
