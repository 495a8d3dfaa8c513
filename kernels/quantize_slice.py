"""CuTe DSL slice quantizer (placeholder until the kernel lands: serves no call)."""


def supported(source, values, column) -> bool:
    return False


def run(source, values, scales, column) -> None:
    raise NotImplementedError
