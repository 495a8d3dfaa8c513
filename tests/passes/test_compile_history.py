"""A compiled program does not depend on what the process compiled before it.

Inductor makes a custom op's fallback lowering at the op's first lowering, and making it
changes how the op's inputs are realized; ``mxfp8_fusion.lowering`` registers the fallbacks
before any lowering instead. Checked in fresh interpreters: the state lives in Inductor's
module globals for the whole process.
"""

import subprocess
import sys
import textwrap

import pytest

_MODEL = """
import torch
import mxfp8_fusion as mf


class NormBeside(torch.nn.Module):
    # a residual sum read by an RMSNorm and by an MXFP8 linear: how the sum is realized
    # decides whether the norm reads it rounded to BF16 or as the FP32 value
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 512, dtype=torch.bfloat16)
        self.w = torch.nn.Parameter(torch.randn(256, dtype=torch.bfloat16))

    def forward(self, x, r):
        h = x + r
        v = h.float()
        n = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        return self.fc(h), n * self.w


torch.manual_seed(0)
model = mf.convert(NormBeside().to(DEVICE))
x = torch.randn(1000, 256, dtype=torch.bfloat16, device=DEVICE) * 3
r = torch.randn(1000, 256, dtype=torch.bfloat16, device=DEVICE) * 3
"""


def _run(code: str, device: str = "cpu") -> str:
    script = _MODEL.replace("DEVICE", repr(device)) + textwrap.dedent(code)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_fallbacks_registered_before_the_first_lowering():
    """At the first compile's post-grad stage (before lowering), Inductor already treats the
    MXFP8 ops as fallbacks that need realized inputs, as it does in every later compile."""
    seen = _run(
        """
        from torch._inductor import lowering

        seen = []

        def spy(graph):
            seen.append(torch.ops.mxfp8.linear.default in lowering.needs_realized_inputs)

        torch._inductor.config.post_grad_custom_post_pass = spy
        with torch.no_grad():
            torch.compile(model)(x, r)
        print(seen)
        """
    )
    assert seen == "[True]"


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)],
)
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inductor", "mxfp8_fusion"])
def test_same_program_same_bytes_in_one_process(device, backend):
    """The same function compiled twice in one process (Dynamo reset, caches off) gives the
    same bytes: the first compile is not lowered differently from the second."""
    same = _run(
        f"""
        outs = []
        for _ in range(2):
            torch._dynamo.reset()
            patch = dict(fx_graph_cache=False, force_disable_caches=True)
            with torch.no_grad(), torch._inductor.config.patch(**patch):
                outs.append(torch.compile(model, backend={backend!r})(x, r))
        print(all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                  for a, b in zip(*outs)))
        """,
        device,
    )
    assert same == "True"
