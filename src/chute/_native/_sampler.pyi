from collections.abc import Buffer

def fill(
    mode: int, length: int, batch: int, seed: int, step: int, first: int, out: Buffer
) -> None: ...
