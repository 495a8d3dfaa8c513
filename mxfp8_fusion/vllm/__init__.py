"""mxfp8_fusion inside vLLM: a plugin that vLLM loads through its ``vllm.general_plugins``
entry point (see :func:`mxfp8_fusion.vllm.plugin.register`).

Nothing here is imported by ``import mxfp8_fusion``, and nothing imports vLLM until vLLM
itself calls the plugin. The parts:

- :mod:`.linear`: the MXFP8 linear kernel's work (pack at load; per call
  ``mxfp8::linear_w8a16`` for W8A16, ``mxfp8::linear`` for W8A8), importable without vLLM;
- :mod:`.policy`: per device, whether that kernel goes ahead of vLLM's and which activation
  it runs;
- :mod:`.kernel`: the vLLM kernel class around it, chosen first for MXFP8 linears;
- :mod:`.compile`: the fusion pass in vLLM's compile pipeline;
- :mod:`.drafter`: EAGLE-3 / DFlash ``fc`` staged slice by slice, without the concatenation;
- :mod:`.settings`: the environment variables that turn the plugin or its parts off or
  choose its kernel's place and activation, and the counters that say what it did in this
  process.
"""
