"""The Inductor post-grad pass and the ``mxfp8_fusion`` torch.compile backend,
installed as ``mxfp8_fusion.passes``."""
