"""`BytesDataset`: records as ``bytes`` (encoded images, serialized examples, text), a loader
stream that yields a list of ``bytes`` per batch."""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from chute.datasets._schema import RecordSchema
from chute.datasets._view import StoreView
from chute.errors import RecordDecodeError, StoreKindError

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
        return self._records(self._indices(indices))

    def _records(self, at: npt.NDArray[np.int64]) -> list[bytes]:
        """The records at checked, non-negative indices ``at``, as ``bytes``."""
        values, offsets = self._store.gather_packed(at)
        data = values.tobytes()
        ends = offsets.tolist()
        return [data[ends[k] : ends[k + 1]] for k in range(len(ends) - 1)]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            return self.__getitems__([key])[0]
        return self.__getitems__(key)

    def __repr__(self) -> str:
        return f"BytesDataset({str(self._path)!r}, {len(self)} records)"


class ImageDataset(BytesDataset):
    """Encoded images (JPEG, PNG, any format Pillow reads) stored as bytes records, decoded
    when read into what ``np.asarray`` makes of Pillow's image, by its mode:

    - ``L`` (greyscale) ``uint8 (h, w)``; ``LA`` ``uint8 (h, w, 2)``; ``RGB``, ``YCbCr``
      ``uint8 (h, w, 3)``; ``RGBA``, ``CMYK`` ``uint8 (h, w, 4)``;
    - ``P`` and ``PA`` (palette) decoded to pixels: ``RGB`` ``uint8 (h, w, 3)``, or ``RGBA``
      ``uint8 (h, w, 4)`` when the palette has transparency;
    - ``1`` (bilevel) ``bool (h, w)``; ``I;16`` (16-bit PNG) ``uint16 (h, w)``; ``I`` ``int32
      (h, w)``; ``F`` (float TIFF) ``float32 (h, w)``.

    The pixels are as stored: EXIF orientation is not applied (``PIL.ImageOps.exif_transpose``
    in a ``map=`` does it), and a multi-frame image (an animated GIF) gives its first frame.
    A record Pillow cannot decode is `chute.errors.RecordDecodeError` naming its index.
    ``ds[indices]`` and ``__getitems__`` return a list of arrays (images may differ in size);
    in a loader with ``workers=N`` the decoding runs in the worker processes. Needs Pillow
    (``pip install chute[images]``).

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
        at = self._indices(indices)
        records = zip(at.tolist(), self._records(at), strict=True)
        return [_decode(data, self._path, index) for index, data in records]

    def __repr__(self) -> str:
        return f"ImageDataset({str(self._path)!r}, {len(self)} records)"


def _decode(data: bytes, where: Any, index: int) -> np.ndarray:
    """Record ``index`` (``data``) as an array; `RecordDecodeError` with Pillow's reason."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("ImageDataset decodes with Pillow: pip install chute[images]") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode in ("P", "PA"):  # palette indices: the pixels are in the palette
                alpha = image.mode == "PA" or "transparency" in image.info
                return np.asarray(image.convert("RGBA" if alpha else "RGB"))
            return np.asarray(image)
    except UnidentifiedImageError:
        reason = "empty" if not data else f"{len(data)} bytes in no format Pillow recognises"
    except (OSError, ValueError, SyntaxError, EOFError, struct.error) as error:
        reason = str(error) or type(error).__name__
    except Image.DecompressionBombError as error:  # over Pillow's MAX_IMAGE_PIXELS
        reason = str(error)
    raise RecordDecodeError(
        f"{where}: record {index} cannot be decoded as an image ({reason})", index=index
    )
