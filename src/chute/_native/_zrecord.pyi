from collections.abc import Sequence
from typing import Any

from collections.abc import Buffer

def gather(
    table: Buffer,
    limits: Buffer,
    fds: Sequence[int],
    idx: Buffer,
    dst: Buffer,
    stride: int,
    offsets: Buffer | None,
    ddict: Any,
    sums: Buffer | None,
    threads: int,
) -> tuple[int, int, int, int]: ...
def compress(
    src: Buffer,
    offsets: Buffer,
    lengths: Buffer,
    codec: int,
    level: int,
    cdict: Any,
    threads: int,
    phys_out: Buffer,
    codec_out: Buffer,
    crc_out: Buffer,
) -> bytearray: ...
def train_dict(samples: Buffer, sizes: Buffer, capacity: int) -> bytes: ...
def make_cdict(dictionary: Buffer, level: int) -> Any: ...
def make_ddict(dictionary: Buffer) -> Any: ...
def crc32c(data: Buffer, value: int = 0) -> int: ...
