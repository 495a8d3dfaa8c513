"""The CuTe DSL slice quantizer on a GPU it is built for: bitwise the reference.

Tests (marked ``gpu``) compare every byte of the destination buffers against
``reference.quantize_slice_`` after poisoning them, so a write outside the slice fails too.
The CPU tests (compiles, predicates, the work-split model) are in test_quantize_kernel_cpu.py.
"""

import pytest
import torch
from helpers.edge_cases import EDGE_BLOCK_NAMES, edge_block_tensor, expected_byte
from helpers.quantize import (
    DTYPES,
    POISON_SCALES,
    POISON_VALUES,
    check_against_reference,
    poisoned,
    requires_sm90,
    wide_range,
)

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_bytes

# --- GPU: bitwise equality ----------------------------------------------------------------


# (tokens, width) pairs: the requested token counts at a few widths, kept to a size that runs
# in seconds; 16384 covers the widest slice.
SHAPES = [
    (1, 128),
    (7, 128),
    (128, 384),
    (129, 128),
    (4097, 128),
    (1, 7168),
    (7, 1024),
    (128, 7168),
    (129, 1024),
    (4096, 384),
    (4097, 1024),
    (7, 16384),
    (129, 16384),
]


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize(("tokens", "width"), SHAPES)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_bitwise_equal_to_reference(dtype, tokens, width, where):
    gen = torch.Generator(device="cuda").manual_seed(tokens * 131 + width)
    k = 3 * width if where == "middle" else 2 * width + 128
    column = {"start": 0, "middle": width, "end": k - width}[where]
    source = wide_range(tokens, width, dtype, "cuda", gen)
    check_against_reference(source, k, column)


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 7, 129, 4097])
def test_strided_source_view(dtype, tokens):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    wide = wide_range(tokens, 3072, dtype, "cuda", gen)
    source = wide[:, 1024:2048]  # row stride 3072, data pointer 2 KiB into each row
    assert source.stride(0) == 3072
    check_against_reference(source, 4096, 2048)


@pytest.mark.gpu
@requires_sm90
def test_six_slices_equal_quantize_of_the_concatenation():
    gen = torch.Generator(device="cuda").manual_seed(6)
    slices = [wide_range(300, 1024, torch.bfloat16, "cuda", gen) for _ in range(6)]
    from mxfp8_fusion.kernels.quantize import host as kernel

    values, scales = poisoned(300, 6144, "cuda")
    for i, s in enumerate(slices):
        kernel.run(s, values, scales, i * 1024)
    want_v, want_s = reference.quantize(torch.cat(slices, dim=1))
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_eager_multi_slice_call_is_one_launch(monkeypatch, tokens):
    """``quantize_input_slices`` with six equal slices takes the one-launch kernel and writes
    the bytes of the one-shot quantizer on the concatenation."""
    import mxfp8_fusion as mf
    from mxfp8_fusion.kernels import dispatch

    launches = []
    run_many = dispatch.quantize_slices

    def counting(*args):
        launches.append(run_many(*args))  # None: the one-launch kernel served the call
        return launches[-1]

    monkeypatch.setattr(dispatch, "quantize_slices", counting)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    slices = [wide_range(tokens, 768, torch.bfloat16, "cuda", gen) for _ in range(6)]
    dest = mf.empty_input(tokens + 5, 6 * 768, "cuda")
    mf.quantize_input_slices(slices, dest)
    assert launches == [None]
    want = mf.quantize(torch.cat(slices, -1))
    assert torch.equal(dest.values[:tokens].view(torch.uint8), want.values.view(torch.uint8))
    live = scale_bytes(tokens, 6 * 768)
    assert torch.equal(dest.scales[:live].view(torch.uint8), want.scales.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [3, 40])
def test_eager_multi_slice_call_of_one_slice(tokens):
    """``quantize_input_slices`` with a single slice (into the second half of the columns)
    writes the one-slice kernel's bytes: one slice compiles the one-slice kernel, whose
    arguments the launch must then pass in that kernel's order."""
    import mxfp8_fusion as mf

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    a = wide_range(tokens, 256, torch.bfloat16, "cuda", gen)
    b = wide_range(tokens, 256, torch.bfloat16, "cuda", gen)
    dest = mf.empty_input(64, 512, "cuda")
    mf.quantize_input_slice(a, dest, 0)
    mf.quantize_input_slices([b], dest, 256)
    torch.cuda.synchronize()
    want = mf.quantize(torch.cat([a, b], -1))
    assert torch.equal(dest.values[:tokens].view(torch.uint8), want.values.view(torch.uint8))
    live = scale_bytes(tokens, 512)
    assert torch.equal(dest.scales[:live].view(torch.uint8), want.scales.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 129, 300])
def test_run_many_equals_per_slice_reference(dtype, tokens):
    """One launch for several slices: views with their own strides, columns out of order and
    with gaps (the gap columns must stay poisoned)."""
    from mxfp8_fusion.kernels.quantize import host as kernel

    gen = torch.Generator(device="cuda").manual_seed(tokens + 77)
    wide = wide_range(tokens, 2048, dtype, "cuda", gen)
    sources = [
        wide_range(tokens, 512, dtype, "cuda", gen),
        wide[:, 512:1024],
        wide[:, 1536:2048],
        wide_range(tokens, 512, dtype, "cuda", gen),
        wide_range(tokens, 512, dtype, "cuda", gen),
    ]
    columns = [2560, 0, 1024, 3584, 512]  # [1536, 2560) and [3072, 3584) stay untouched
    capacity, k = 512, 4096
    values, scales = poisoned(capacity, k, "cuda")
    want_v, want_s = poisoned(capacity, k, "cuda")
    assert kernel.refusal_many(sources, values, columns) is None
    kernel.run_many(sources, values, scales, columns)
    for source, column in zip(sources, columns, strict=True):
        reference.quantize_slice_(source, want_v, want_s, column)
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 64])  # the few-token tile and the default one
def test_run_many_cuda_graph_replay(tokens):
    from mxfp8_fusion.kernels.quantize import host as kernel

    gen = torch.Generator(device="cuda").manual_seed(21)
    sources = [wide_range(tokens, 1024, torch.bfloat16, "cuda", gen) for _ in range(6)]
    columns = [i * 1024 for i in range(6)]
    values, scales = poisoned(128, 6144, "cuda")
    kernel.run_many(sources, values, scales, columns)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.run_many(sources, values, scales, columns)
    for s in sources:
        s.copy_(wide_range(tokens, 1024, torch.bfloat16, "cuda", gen))
    graph.replay()
    want_v, want_s = reference.quantize(torch.cat(sources, dim=1))
    torch.cuda.synchronize()
    assert torch.equal(values.view(torch.uint8)[:tokens], want_v.view(torch.uint8))
    assert bool((values.view(torch.uint8)[tokens:] == POISON_VALUES).all())
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


def _check_many_with_padding(sources, columns, k: int, capacity: int, **launch) -> None:
    """run_many into poisoned buffers: bitwise the per-slice reference; and, checked apart
    from the reference, scale byte 127 for the rows [tokens, roundup(tokens, 128)) of every
    group of the slices, poison left in value rows past ``tokens``, in the columns no slice
    owns and in the row blocks past the 128-row boundary."""
    from mxfp8_fusion.format import scale_offset
    from mxfp8_fusion.kernels.quantize import host as kernel

    tokens, width = sources[0].shape
    values, scales = poisoned(capacity, k, "cuda")
    want_v, want_s = poisoned(capacity, k, "cuda")
    assert kernel.refusal_many(sources, values, columns) is None
    kernel.run_many(sources, values, scales, columns, **launch)
    for source, column in zip(sources, columns, strict=True):
        reference.quantize_slice_(source, want_v, want_s, column)
    got_v, got_s = values.view(torch.uint8), scales.view(torch.uint8)
    if not torch.equal(got_v, want_v.view(torch.uint8)):
        bad = (got_v != want_v.view(torch.uint8)).nonzero()[:5].tolist()
        pytest.fail(f"value bytes differ at (row, col): {bad}")
    if not torch.equal(got_s, want_s.view(torch.uint8)):
        bad = (got_s != want_s.view(torch.uint8)).nonzero()[:5].flatten().tolist()
        pytest.fail(f"scale bytes differ at offsets {bad}")
    padded = (tokens + 127) // 128 * 128
    groups = torch.cat([torch.arange(c // 32, (c + width) // 32) for c in columns])
    pad_rows = torch.arange(tokens, padded)[:, None]
    pad = scale_offset(pad_rows, groups[None, :], k).flatten().to(got_s.device)
    assert bool((got_s[pad] == 127).all()), "padding rows must hold scale byte 127"
    assert bool((got_v[tokens:] == POISON_VALUES).all()), "value rows past tokens written"
    owned = torch.zeros(k, dtype=torch.bool)
    for c in columns:
        owned[c : c + width] = True
    assert bool((got_v[:, ~owned.to(got_v.device)] == POISON_VALUES).all())
    g4 = (k // 32 + 3) // 4
    assert bool((got_s[padded // 128 * g4 * 512 :] == POISON_SCALES).all())


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 2, 16, 17, 127, 128, 129])
@pytest.mark.parametrize(
    ("tile_rows", "small_tokens"), [(64, 16), (64, 0), (64, 32), (16, 16), (32, 32), (128, 16)]
)
def test_run_many_few_tokens_padding(tokens, tile_rows, small_tokens):
    """Few tokens through every tile shape: the few-token tile, the last (partial) row tile
    with its warp guards and padding walk, and tiles wholly past ``tokens`` (not launched)."""
    gen = torch.Generator(device="cuda").manual_seed(tokens * 7 + tile_rows + small_tokens)
    width = 1024
    wide = wide_range(tokens, 3 * width, torch.bfloat16, "cuda", gen)
    sources = [wide[:, width : 2 * width]]  # a strided view
    sources += [wide_range(tokens, width, torch.bfloat16, "cuda", gen) for _ in range(5)]
    columns = [4096, 0, 2048, 1024, 6144, 5120]  # [3072, 4096) and [7168, 7296) untouched
    _check_many_with_padding(
        sources, columns, 7296, 384, tile_rows=tile_rows, small_tokens=small_tokens
    )


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 16, 127, 129])
def test_run_many_benchmark_geometry_few_tokens(dtype, tokens):
    """The benchmark's six 7168-wide slices (14 few-token CTAs per slice) into a wider
    destination whose last 256 columns belong to no slice."""
    gen = torch.Generator(device="cuda").manual_seed(tokens + 1000)
    sources = [wide_range(tokens, 7168, dtype, "cuda", gen) for _ in range(6)]
    columns = [i * 7168 for i in range(6)]
    _check_many_with_padding(sources, columns, 6 * 7168 + 256, 256)


# --- edge-case blocks ---------------------------------------------------------------------


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_edge_case_blocks(dtype):
    gen = torch.Generator(device="cuda").manual_seed(1)
    names, rows = [], []
    for name in EDGE_BLOCK_NAMES:
        names.append(name)
        rows.append(edge_block_tensor(name, dtype).float()[0])
    blocks = torch.stack(rows)  # [n, 32]
    # Every block at every group position of a 128-column tile, in shuffled element order.
    n = blocks.shape[0]
    perm = torch.stack([torch.randperm(32) for _ in range(4 * n)]).view(4 * n, 32)
    tiled = blocks.repeat(4, 1).gather(1, perm).view(4, n, 32).permute(1, 0, 2).reshape(n, 128)
    source = tiled.to(dtype).cuda()
    check_against_reference(source, 384, 128)
    # And the scale bytes the rule pins down, independently of the reference.
    from mxfp8_fusion.format import scale_offset
    from mxfp8_fusion.kernels.quantize import host as kernel

    values, scales = poisoned(128, 128, "cuda")
    kernel.run(source, values, scales, 0)
    scales_cpu = scales.view(torch.uint8).cpu()
    for row, name in enumerate(names):
        want = expected_byte(name, dtype)
        got = [int(scales_cpu[scale_offset(row, g, 128)]) for g in range(4)]
        assert got == [want] * 4, f"{name}: scale bytes {got}, expected {want}"
    del gen


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("small_tokens", [16, 32])
def test_edge_case_blocks_few_token_tile(dtype, small_tokens):
    """The special blocks (Inf, NaN, subnormal, ...) through the few-token tile, which
    handles 2 or 4 column tiles per thread: every block in every column tile and group."""
    torch.manual_seed(2)
    blocks = torch.stack([edge_block_tensor(name, dtype).float()[0] for name in EDGE_BLOCK_NAMES])
    n = blocks.shape[0]
    perm = torch.stack([torch.randperm(32) for _ in range(16 * n)]).view(16 * n, 32)
    tiled = blocks.repeat(16, 1).gather(1, perm).view(16, n, 32).permute(1, 0, 2).reshape(n, 512)
    source = tiled.to(dtype).cuda()
    for start in range(0, n, 13):  # at most 13 rows: one few-token launch each
        chunk = source[start : start + 13]
        check_against_reference(chunk, 1024, 512, small_tokens=small_tokens)
        _check_many_with_padding(
            [chunk, chunk.flip(1).contiguous()], [512, 0], 1024, 128, small_tokens=small_tokens
        )
