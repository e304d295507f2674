from collections.abc import Sequence
from typing import Any

# Any object exporting a C-contiguous buffer (numpy arrays, bytes, bytearray, mmap).
_Buffer = Any

def gather(
    table: _Buffer,
    limits: _Buffer,
    chunks: Any,
    idx: _Buffer,
    dst: _Buffer,
    stride: int,
    offsets: _Buffer | None,
    ddict: Any,
    sums: _Buffer | None,
    strict: bool,
    threads: int,
) -> tuple[int, int, int, int]: ...
def read_tokens(
    sources: Sequence[tuple[tuple[int, int, int, int], tuple[Any, ...]]],
    which: _Buffer | None,
    lo: _Buffer,
    length: _Buffer,
    out: _Buffer | None,
    doc_counts: _Buffer | None,
    threads: int,
    held_only: bool = ...,
) -> tuple[int, int, int, int, bytearray | None, int]: ...
def read_windows(
    sources: Sequence[tuple[tuple[int, int, int, int], tuple[Any, ...]]],
    offsets: _Buffer | None,
    positions: _Buffer,
    seq_len: int,
    out: _Buffer,
    source_out: _Buffer | None,
    doc_counts: _Buffer | None,
    threads: int,
) -> tuple[int, int, int, int, bytearray | None, int]: ...
def pack_groups(
    starts: _Buffer,
    stops: _Buffer,
    bins: _Buffer,
    docs: _Buffer,
    doc_counts: _Buffer,
    seq_len: int,
) -> list[bytes]: ...
def read_packed(
    source: tuple[tuple[int, int, int, int], tuple[Any, ...]],
    tables: dict[int, bytes],
    sequences: _Buffer,
    group: int,
    out_tokens: _Buffer,
    out_ids: _Buffer,
    out_positions: _Buffer,
    threads: int,
) -> tuple[int, int, int, int, None, int]: ...
def gather_many(
    stores: Sequence[tuple[Any, ...]],
    which: _Buffer,
    idx: _Buffer,
    dst: _Buffer,
    stride: int,
    offsets: _Buffer | None,
    threads: int,
) -> tuple[int, int, int, int]: ...
def map_chunks(fds: Sequence[int]) -> Any: ...
def chunks_from_buffers(buffers: Sequence[_Buffer]) -> Any: ...
def compress(
    src: _Buffer,
    offsets: _Buffer,
    lengths: _Buffer,
    codec: int,
    level: int,
    cdict: Any,
    threads: int,
    phys_out: _Buffer,
    codec_out: _Buffer,
    crc_out: _Buffer,
) -> bytearray | None: ...
def train_dict(samples: _Buffer, sizes: _Buffer, capacity: int) -> bytes: ...
def make_cdict(dictionary: _Buffer, level: int) -> Any: ...
def make_ddict(dictionary: _Buffer) -> Any: ...
def crc32c(data: _Buffer, value: int = 0) -> int: ...
def load_state(header: _Buffer) -> tuple[int, int, int]: ...
def store_state(header: _Buffer, tail_chunk: int, tail_offset: int, length: int) -> None: ...
def load_generation(gen: _Buffer) -> int: ...
def first_moved(stamps: Sequence[tuple[_Buffer, int]]) -> int: ...
def shard_split(
    starts: _Buffer, idx: _Buffer, which_out: _Buffer, local_out: _Buffer
) -> list[int]: ...
def store_generation(gen: _Buffer, value: int) -> None: ...
def put_entry(map: _Buffer, offset: int, entry: bytes) -> None: ...

# Gather error codes (defined once, in gather.h), the format's record cap, zstd's levels.
GE_INDEX: int
GE_CHUNK: int
GE_BOUNDS: int
GE_TOO_LARGE: int
GE_CODEC: int
GE_NO_DICT: int
GE_DECODE: int
GE_LENGTH: int
GE_DST: int
GE_CHECKSUM: int
GE_NOMEM: int
GE_TABLE: int
GE_SUMS: int
TE_SPAN: int
TE_HEADER: int
TE_STARTS: int
TE_OUT: int
MAX_RECORD: int
ZSTD_MIN_LEVEL: int
ZSTD_MAX_LEVEL: int
CODEC_RAW: int
CODEC_ZSTD: int
CODEC_ZSTD_DICT: int
LOC_SIZE: int
SUM_SIZE: int
