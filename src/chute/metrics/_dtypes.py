"""Dtype inference, widening and checked conversion of logged values."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from functools import partial
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple

import numpy as np

from ._format import JSONL, NUMERIC_DTYPES, code_of

_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1
#: struct format per numeric code, for packing one value without building an array.
_STRUCT_CODES = {
    "f32": "f",
    "f64": "d",
    "i8": "b",
    "i16": "h",
    "i32": "i",
    "i64": "q",
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "Q",
}
PACK = {c: struct.Struct("<" + _STRUCT_CODES[c]) for c in NUMERIC_DTYPES}


class Value(NamedTuple):
    """One logged measurement, captured at `write()` time (a tuple: cheap to build)."""

    code: str  # the dtype this value alone asks for
    num: int | float | None  # Python number for numeric codes, None for JSON values
    json: str | None  # JSON text; None for a Python float until `text()` needs it
    explicit: bool  # typed by NumPy (taken as-is) rather than a Python number


#: `Value` built from one tuple without the Python frame of a named tuple's `__new__`
#: (the writers' hot paths build one per scalar).
new_value: Callable[[tuple[str, int | float | None, str | None, bool]], Value] = partial(
    tuple.__new__, Value
)


def text(val: Value) -> str:
    """JSON text of a captured value (for the hot log and JSONL columns)."""
    if val.json is not None:
        return val.json
    assert isinstance(val.num, float)
    return float_json(val.num)


def _json_default(obj: object) -> object:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"value of type {type(obj).__name__} is not JSON serialisable")


def _to_json(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_json_default)


def _int_code(v: int) -> str:
    if -(2**63) <= v <= _I64_MAX:
        return "i64"
    if 0 <= v <= _U64_MAX:
        return "u64"
    raise OverflowError(f"integer {v} does not fit in 64 bits")


def capture(value: object) -> Value:
    """Classify and freeze one value following the auto-dtype rules."""
    t = type(value)
    if t is float:
        return new_value(("f64", value, None, False))  # type: ignore[arg-type]
    if t is str:
        return Value(JSONL, None, encode_basestring_ascii(value), False)  # type: ignore[arg-type]
    if t is int:
        return Value(_int_code(value), value, str(value), False)  # type: ignore[arg-type]
    if t is np.float32 or t is np.float64:  # what training loops log most: no array made
        return new_value(("f32" if t is np.float32 else "f64", float(value), None, True))  # type: ignore[arg-type]
    if isinstance(value, (np.generic, np.ndarray)):
        return _capture_array(np.asarray(value))
    if str(getattr(value, "dtype", "")).startswith("torch."):
        return _capture_torch(value)
    if hasattr(value, "__array__"):
        return _capture_array(np.asarray(value))
    if isinstance(value, bool):
        return Value(JSONL, None, _to_json(value), False)
    if isinstance(value, int):
        return Value(_int_code(value), int(value), str(int(value)), False)
    if isinstance(value, float):
        return Value("f64", float(value), float_json(float(value)), False)
    return Value(JSONL, None, _to_json(value), False)


#: torch dtype name -> storage code; narrow floats widen exactly to f32.
_TORCH_CODES = {
    "float64": "f64",
    "double": "f64",
    "float32": "f32",
    "float": "f32",
    "float16": "f32",
    "half": "f32",
    "bfloat16": "f32",
    **{f"int{w}": f"i{w}" for w in (8, 16, 32, 64)},
    **{f"uint{w}": f"u{w}" for w in (8, 16, 32, 64)},
}


def _capture_torch(value: Any) -> Value:
    """A 0-d torch tensor of any device, grad or float dtype (bf16/fp16/fp8 widen to f32)."""
    name = str(value.dtype)[len("torch.") :]
    if value.dim() != 0:
        raise ValueError(f"tensor values must be 0-d scalars, got shape {tuple(value.shape)}")
    num = value.item()  # detaches and copies to the host
    if name == "bool":
        return Value(JSONL, None, _to_json(bool(num)), True)
    code = _TORCH_CODES.get(name) or ("f32" if name.startswith("float8") else None)
    if code is None:
        raise TypeError(f"tensor dtype {value.dtype} is not supported (floats and ints only)")
    if code[0] == "f":
        return Value(code, float(num), float_json(float(num)), True)
    return Value(code, int(num), str(int(num)), True)


def _capture_array(arr: np.ndarray[Any, Any]) -> Value:
    """NumPy scalars and 0-d arrays keep their own dtype."""
    if arr.ndim != 0:
        raise ValueError(f"array values must be 0-d scalars, got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind == "b":
        return Value(JSONL, None, _to_json(bool(arr)), True)
    if (kind == "f" and arr.dtype.itemsize < 4) or _narrow_float(arr.dtype):
        arr = arr.astype(np.float32)  # f16, bf16, fp8: exactly representable in f32
        kind = "f"
    if kind in "fiu":
        code = code_of(arr.dtype)
        if code is None:
            raise TypeError(f"dtype {arr.dtype} is not supported (f32, f64, 8-64 bit ints only)")
        num = arr.item()
        text = str(num) if kind in "iu" else float_json(float(num))
        return Value(code, num, text, True)
    if kind in "USO":
        return Value(JSONL, None, _to_json(arr.item()), True)
    raise TypeError(f"dtype {arr.dtype} is not supported")


def _narrow_float(dtype: np.dtype[Any]) -> bool:
    """ml_dtypes' bfloat16/float8 (what JAX arrays hold): not a NumPy float kind."""
    return dtype.kind == "V" and dtype.name.startswith(("bfloat16", "float8"))


_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def float_json(v: float) -> str:
    """JSON text of a float, with Python's NaN/Infinity literals (as `json.dumps` writes)."""
    text = repr(v)
    return _NONFINITE.get(text, text)


def _is_int(code: str) -> bool:
    return code[0] in "iu"


def _width(code: str) -> int:
    return int(code[1:])


def _promote_ints(cur: str, new: str, lo: int, hi: int, v: int) -> str:
    """Widen integer storage so every stored value and `v` stay exact."""
    if cur[0] == new[0]:
        return cur if _width(cur) >= _width(new) else new
    signed, unsigned = (cur, new) if cur[0] == "i" else (new, cur)
    wu = _width(unsigned)
    if wu < 64:
        return f"i{max(_width(signed), 2 * wu)}"
    lo, hi = min(lo, v), max(hi, v)
    if lo >= 0:
        return "u64"
    if hi <= _I64_MAX:
        return "i64"
    raise OverflowError(f"negative value cannot share a column with values above {_I64_MAX}")


def resolve(cur: str | None, val: Value, lo: int = 0, hi: int = 0) -> str:
    """The storage code after `val` joins a column stored as `cur` (None: a new metric).

    `lo`/`hi` are the stored integer extremes, needed only to mix signs with `u64`.
    Raises TypeError/OverflowError without side effects when `val` cannot join.
    """
    code = val.code
    if cur is None:
        if code == "f32" and not val.explicit:
            check_f32(val.num)
        return code
    if cur == JSONL:
        return JSONL
    if code == JSONL:
        raise TypeError(f"a non-numeric value ({text(val)[:40]}) cannot join a {cur} metric")
    if _is_int(cur):
        if not _is_int(code):
            raise TypeError(f"float value {text(val)} cannot join integer ({cur}) metric")
        assert isinstance(val.num, int)
        return _promote_ints(cur, code, lo, hi, val.num)
    # Float column.
    if _is_int(code):
        assert isinstance(val.num, int)
        if cur == "f32" and float(np.float32(val.num)) == val.num:
            return cur
        if int(float(val.num)) == val.num:
            return "f64"
        raise OverflowError(f"integer {val.num} is not exactly representable as a float")
    if val.explicit:
        return "f64" if "f64" in (cur, code) else cur
    if cur == "f32":
        check_f32(val.num)
    return cur


def check_f32(v: float | int | None) -> None:
    """Reject a finite Python float that float32 storage would turn into infinity."""
    try:
        _PACK_F32.pack(v)  # type: ignore[arg-type]
    except OverflowError:
        raise OverflowError(f"float {v} overflows float32 storage") from None


_PACK_F32 = struct.Struct("<f")


def fits(code: str, v: int) -> bool:
    """Whether integer `v` is representable in integer storage `code`."""
    info = np.iinfo(NUMERIC_DTYPES[code])
    return int(info.min) <= v <= int(info.max)


def tightest_int(lo: int, hi: int) -> str:
    """Smallest integer code holding [lo, hi]; unsigned preferred when nothing is negative."""
    prefix = "u" if lo >= 0 else "i"
    for w in (8, 16, 32, 64):
        code = f"{prefix}{w}"
        if fits(code, lo) and fits(code, hi):
            return code
    raise OverflowError(f"range [{lo}, {hi}] does not fit 64-bit integers")


def natural_code(value: Any) -> str:
    """The code a fresh metric would get for a value read back from JSON (hot log)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return JSONL
    if isinstance(value, int):
        return _int_code(value) if -(2**63) <= value <= _U64_MAX else JSONL
    return "f32"  # how Plättli's reader types a hot-only float (no manifest entry yet)
