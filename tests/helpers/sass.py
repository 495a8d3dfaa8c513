"""Reading the SASS of a CPU-compiled kernel build: where an mbarrier arrive issues while a
shared-memory load is still in flight.

An mbarrier arrive that frees a shared-memory stage must not issue before the loads that
read the stage have returned, or the producer's next TMA can overwrite the stage under
them. ptxas does not order them: an arrive waits for no load scoreboard (docs/gemm_log.md,
variant 53). Each SASS instruction's control bits say which scoreboard its result sets and
which scoreboards it waits on before issuing, so an arrive whose issue can precede a load's
return is one issued while that load's scoreboard is set and not yet waited on. The
disassembler comes from the ``nvidia-cuda-nvdisasm`` wheel (the test extra) or a CUDA
toolkit.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]{16}) \*/")
_CONTROL = re.compile(r"/\* (0x[0-9a-f]{16}) \*/")
_NO_BARRIER = 7


def nvdisasm() -> str | None:
    """The path of an nvdisasm binary, or None."""
    for root in map(Path, sys.path):
        for found in sorted(root.glob("nvidia/cu*/bin/nvdisasm")):
            return str(found)
    return shutil.which("nvdisasm")


def instructions(cubin: bytes) -> list[tuple[int, str, int, int]]:
    """(offset, text, wait mask, write scoreboard) of each instruction of ``cubin``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [nvdisasm(), "-hex", "-novliw", f.name], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    found = []
    for line, following in itertools.pairwise(text):
        head, tail = _LINE.search(line), _CONTROL.search(following)
        if head and tail:
            # Volta+ control bits, in the high word from bit 41: stall (4), yield, write
            # scoreboard (3), read scoreboard (3), wait mask (6), reuse (4)
            control = int(tail.group(1), 16) >> 41
            found.append(
                (int(head.group(1), 16), head.group(2), (control >> 11) & 0x3F, (control >> 5) & 7)
            )
    return found


def arrives_before_loads_return(cubin: bytes) -> list[str]:
    """Each mbarrier arrive (``SYNCS.ARRIVE``) that can issue while a shared-memory load
    (``LDS``) issued before it is still in flight, with the loads' offsets: scanned in
    program order, a load's scoreboard counts as in flight until an instruction waits on
    it. Branches are followed as straight-line code, which can only keep a load pending
    longer (conservative)."""
    pending: dict[int, int] = {}
    found = []
    for offset, text, wait, board in instructions(cubin):
        for b in list(pending):
            if wait >> b & 1:
                del pending[b]
        if "SYNCS.ARRIVE" in text and pending:
            loads = ", ".join(f"{o:#x}" for o in sorted(pending.values()))
            found.append(f"{offset:#x} {text} (loads at {loads} in flight)")
        if re.search(r"\bLDS\b|\bLDS\.", text) and board != _NO_BARRIER:
            pending[board] = offset
    return found


# The DSL reads CUTE_DSL_KEEP once, when it is first loaded: an earlier test of the session
# that compiled in this process would leave the cubin unkept, so builds are compiled in a
# fresh interpreter, which writes their cubins where it is told.
_COMPILE = textwrap.dedent(
    """
    import json, sys, torch
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select
    entry, tokens, n, cases = json.loads(sys.argv[1])
    cfg = select.config_of(entry, tokens)
    for widths, path in cases:
        build = host.compile_gemm(cfg, n, tuple(widths), n, torch.bfloat16, None)
        with open(path, "wb") as f:
            f.write(build.__cubin__)
    """
)


def compile_cubins(entry: dict, tokens: int, n: int, slice_widths, folder: Path) -> list[bytes]:
    """The sm_90a cubins of the W8A16 build of schedule ``entry`` at ``tokens`` on N ``n``,
    one per slice-widths tuple in ``slice_widths``, compiled on this machine (no GPU)."""
    cases = [(w, str(folder / f"{i}.cubin")) for i, w in enumerate(slice_widths)]
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin")
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps([entry, tokens, n, cases])],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return [Path(path).read_bytes() for _, path in cases]


def local_memory_accesses(cubin: bytes) -> list[str]:
    """The instructions of ``cubin`` that store to or load from local memory (``STL``,
    ``LDL``): register spills, in these kernels, which keep no arrays in local memory."""
    return [text for _, text, _, _ in instructions(cubin) if re.search(r"\b(STL|LDL)\b", text)]


def sets_register_counts(cubin: bytes) -> bool:
    """Whether ``cubin`` moves registers between warpgroups (``USETMAXREG``): ptxas drops a
    ``setmaxnreg`` it cannot honour, with only a build-time note."""
    return any("USETMAXREG" in text for _, text, _, _ in instructions(cubin))
