"""`BytesDataset`: records as ``bytes`` (encoded images, serialized examples, text), a loader
stream that yields a list of ``bytes`` per batch."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from chute.datasets._schema import RecordSchema
from chute.datasets._view import StoreView
from chute.errors import CorruptStoreError, StoreKindError

_BYTES = RecordSchema(dtype=np.dtype(np.uint8), item_shape=(), ragged=True)


class BytesDataset(StoreView):
    """Records as ``bytes``, exactly as written (no padding, no trailing NUL lost): what
    `write_ragged` writes from ``bytes`` objects, or any Zrecord store without schema.json
    (``RecordStore.append`` of bytes, a loaderx store of raw records).

    ``ds[i]`` is one record's bytes; ``ds[indices]``, ``ds[a:b]`` and ``__getitems__`` a list
    of them, from one native gather. It is a loader stream as it is: in a per-record ``map=``
    a record is its bytes (decode a JPEG there, in ``workers=`` processes for many cores).

    >>> import tempfile
    >>> from chute import BytesDataset, write_ragged
    >>> path = tempfile.mkdtemp() + "/blobs.zr"
    >>> write_ragged(path, [b"jpeg\\x00", b"", b"png\\x00\\x00"]).close()
    >>> ds = BytesDataset(path)
    >>> ds[0], ds[[2, 1]], len(ds)
    (b'jpeg\\x00', [b'png\\x00\\x00', b''], 3)
    >>> ds.close()
    """

    _ragged = True
    _bare = _BYTES

    def _check(self) -> None:
        if self._schema.dtype.itemsize != 1 or self._item_shape != ():
            raise StoreKindError(
                f"{self._path} holds {self._schema.describe()}, not bytes: open it with "
                "RaggedDataset (a record of bytes is a row of single bytes: uint8 rows of "
                "shape ())"
            )

    def __getitems__(self, indices: Any) -> list[bytes]:
        """The records of a sequence of indices (or a slice), as ``bytes``."""
        values, offsets = self._store.gather_packed(self._indices(indices))
        data = values.tobytes()
        at = offsets.tolist()
        return [data[at[k] : at[k + 1]] for k in range(len(at) - 1)]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            return self.__getitems__([key])[0]
        return self.__getitems__(key)

    def __repr__(self) -> str:
        return f"BytesDataset({str(self._path)!r}, {len(self)} records)"


class ImageDataset(BytesDataset):
    """Encoded images (JPEG, PNG, any format Pillow reads) stored as bytes records, decoded
    to ``uint8`` arrays when read: ``(height, width)`` for greyscale, ``(height, width,
    channels)`` otherwise, as Pillow gives them. ``ds[indices]`` and ``__getitems__`` return a
    list of arrays (images may differ in size); in a loader with ``workers=N`` the decoding
    runs in the worker processes. Needs Pillow (``pip install chute[images]``).

    >>> import io, tempfile, numpy as np
    >>> from PIL import Image
    >>> from chute import ImageDataset, write_ragged
    >>> png = io.BytesIO()
    >>> Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4)).save(png, format="PNG")
    >>> path = tempfile.mkdtemp() + "/images"
    >>> write_ragged(path, [png.getvalue()]).close()
    >>> with ImageDataset(path) as ds:
    ...     ds[0].shape, ds[0][2].tolist()
    ((3, 4), [8, 9, 10, 11])
    """

    def __getitems__(self, indices: Any) -> list[np.ndarray]:  # type: ignore[override]
        """The images of a flat sequence of indices, decoded."""
        return [_decode(data, self._path) for data in super().__getitems__(indices)]

    def __repr__(self) -> str:
        return f"ImageDataset({str(self._path)!r}, {len(self)} records)"


def _decode(data: bytes, where: Any) -> np.ndarray:
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("ImageDataset decodes with Pillow: pip install chute[images]") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image)
    except (UnidentifiedImageError, OSError) as error:
        raise CorruptStoreError(
            f"{where}: a record is not an image Pillow can read ({error})"
        ) from None
