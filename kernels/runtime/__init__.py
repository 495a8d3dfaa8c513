"""How kernels are compiled (TVM-FFI), kept on disk and launched; shared inline-PTX helpers."""
