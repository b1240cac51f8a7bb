"""Packed numeric arrays carried by events: token ids, behaviour log-probs, generated masks.

A rollout carries hundreds to thousands of numbers. As MessagePack arrays each one is a
Python object to build and check on every hop (about 25 us per 4 KB event on these
machines, most of a consumer's CPU). Here they travel as one MessagePack ``bin`` of
little-endian machine values and decode into an :class:`array.array` with one copy:

=================  ========  =======================================
class              typecode  values
=================  ========  =======================================
:class:`TokenArray`    ``i`` int32, ``0 <= id < 2**31``
:class:`LogProbArray`  ``f`` float32, finite, ``-1e4 <= lp <= 0``
:class:`MaskArray`     ``B`` uint8, 0 or 1
=================  ========  =======================================

They are ordinary sequences (``len``, indexing, iteration, ``tolist()``), expose the
buffer protocol (``torch.frombuffer``, ``numpy.frombuffer`` view them without a copy),
and compare equal to lists of the same values. Constructors of events accept plain
lists and convert them (see ``coerce``). Readers also accept the version-1 wire form, a
MessagePack array of numbers, so old topics still replay.

Log-probs are stored as float32: the precision samplers compute them in; the
importance ratio's error from the rounding is below 1e-6.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterable
from typing import Any, ClassVar, Self

import numpy as np

MAX_TOKENS = 1 << 17
_BIG_ENDIAN = sys.byteorder == "big"
_BELOW_0X80 = bytes(range(0x80))
# Most significant bytes (little-endian: the 4th) of float32 values in [-8192, -0.0]: the
# sign bit set and an exponent below 2**13. Every other byte needs the exact check.
_NEGATIVE_ABOVE_MINUS_8192 = bytes(range(0x80, 0xC6))


class PackedArray(array.array):  # type: ignore[type-arg]
    """Base of the packed arrays: one typecode, a wire form, validation."""

    TYPECODE: ClassVar[str]
    ITEMSIZE: ClassVar[int]
    WHAT: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.ITEMSIZE = array.array(cls.TYPECODE).itemsize

    def __new__(cls, values: Iterable[Any] | bytes = ()) -> Self:
        return super().__new__(cls, cls.TYPECODE, values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list | tuple):
            return self.tolist() == list(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable sequence, like list

    # Wire form -------------------------------------------------------------------------

    def to_wire(self) -> bytes:
        if _BIG_ENDIAN:
            swapped = array.array(self.typecode, self)
            swapped.byteswap()
            return swapped.tobytes()
        return self.tobytes()

    @classmethod
    def from_wire(cls, raw: Any) -> Self:
        """Decode (and validate) the wire form: packed bytes, or a version-1 list."""
        if isinstance(raw, list):
            return cls.coerce(raw)
        if not isinstance(raw, bytes):
            raise TypeError(f"{cls.WHAT} must be packed bytes or an array, got {type(raw).__name__}")
        if len(raw) % cls.ITEMSIZE or len(raw) > MAX_TOKENS * cls.ITEMSIZE:
            raise ValueError(f"{cls.WHAT}: {len(raw)} bytes is not a whole number of at most {MAX_TOKENS} "
                             f"{cls.ITEMSIZE}-byte values")
        cls.check_packed(raw)
        out = cls()
        out.frombytes(raw)
        if _BIG_ENDIAN:
            out.byteswap()
        return out

    @classmethod
    def coerce(cls, values: Iterable[Any]) -> Self:
        """``values`` (a list, tuple, array or numpy array) as this class, validated like the wire form."""
        try:
            out = values if type(values) is cls else cls(values)
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"{cls.WHAT}: {exc}") from None
        if len(out) > MAX_TOKENS:
            raise ValueError(f"{cls.WHAT}: {len(out)} values, at most {MAX_TOKENS}")
        cls.check_packed(out.to_wire())
        return out

    @classmethod
    def check_packed(cls, raw: bytes) -> None:
        """Raise ValueError when a value of ``raw`` (little-endian) is out of range."""
        raise NotImplementedError


class TokenArray(PackedArray):
    """Token ids: int32, ``0 <= id < 2**31``."""

    TYPECODE = "i"
    WHAT = "token ids"

    @classmethod
    def check_packed(cls, raw: bytes) -> None:
        # Little-endian int32 is non-negative iff each value's last byte is below 0x80.
        if raw[3::4].translate(None, _BELOW_0X80):
            raise ValueError("token ids must be in [0, 2**31)")


class LogProbArray(PackedArray):
    """Behaviour log-probs: float32, finite, in ``[-1e4, 0]``."""

    TYPECODE = "f"
    WHAT = "log-probs"

    @classmethod
    def check_packed(cls, raw: bytes) -> None:
        if not raw[3::4].translate(None, _NEGATIVE_ABOVE_MINUS_8192):
            return  # every value is in [-8192, -0.0]: the usual case, checked in ~0.3 us
        values = np.frombuffer(raw, dtype="<f4")
        # NaN fails both comparisons; +-inf fails one.
        if values.size and not (values.min() >= -1e4 and values.max() <= 0.0):
            raise ValueError("log-probs must be finite and in [-1e4, 0]")


class MaskArray(PackedArray):
    """Generated-token masks: uint8, 0 or 1."""

    TYPECODE = "B"
    WHAT = "generated mask"

    @classmethod
    def check_packed(cls, raw: bytes) -> None:
        if raw.translate(None, b"\x00\x01"):
            raise ValueError("generated mask values must be 0 or 1")


def enc_hook(obj: Any) -> Any:
    """msgspec encoder hook: packed arrays go on the wire as ``bin``."""
    if isinstance(obj, PackedArray):
        return obj.to_wire()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def dec_hook(tp: Any, obj: Any) -> Any:
    """msgspec decoder hook: builds (and validates) packed arrays; errors become ValidationErrors."""
    if isinstance(tp, type) and issubclass(tp, PackedArray):
        return tp.from_wire(obj)
    raise NotImplementedError(f"cannot decode {tp!r}")
