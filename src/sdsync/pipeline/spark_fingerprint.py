"""The limbs of the RBSR fingerprint (:mod:`sdsync.reconcile.fingerprint`) as Spark
column expressions, for archives Spark's own reader must read.

Theory of operation
-------------------
A range's summary is ``(count, s0..s7)``: the item count and, per 32-bit limb of the
hashes (most significant first), the plain sum of the limbs as a long.  Sums add, so a
range's summary is the sum of its sub-ranges' summaries, and the whole hierarchy is
built from one scan; :func:`~sdsync.reconcile.fingerprint.sum_from_limb_sums` and
:func:`~sdsync.reconcile.fingerprint.fingerprint_of_sum` turn a summary into the
fingerprint.  (Local archives are summed faster by :mod:`sdsync.pipeline.arrow_leaves`.)

Reading a limb.  Spark has no built-in that reads bytes as an integer; the hex-string
route (``conv(hex(substring(h, …)), 16, 10)``) costs 6-7x a plain scan, and an Arrow
batch function pays for shipping every hash to Python.  But CRC-32 of a 4-byte block is
an *affine bijection* of the 32 input bits over GF(2) (``crc(m) = L(m) xor crc(0)``
with ``L`` linear and invertible: for messages of at most 32 bits the CRC remainder
loses nothing).  So ``m = L⁻¹(crc32(m) xor crc(0))``, and a linear map of 32 bits is
four table look-ups of 8 bits each, xored.  ``crc32``, ``substring``, ``get`` on a
literal array and the bit operations all run in Spark's generated code: the limbs cost
about as much as the scan itself.  The tables are derived here from ``zlib.crc32``
(the same CRC-32 as Spark's) and checked on import.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from functools import cache

from pyspark.sql import Column
from pyspark.sql import functions as sf

from sdsync.reconcile.fingerprint import LIMB_BITS, LIMBS

LIMB_MASK = (1 << LIMB_BITS) - 1
_CRC_OF_ZERO = zlib.crc32(bytes(4))


def _crc_linear_part(m: int) -> int:
    return zlib.crc32(m.to_bytes(4, "big")) ^ _CRC_OF_ZERO


def _invert_gf2(images: Sequence[int]) -> list[int]:
    """Given L(1<<i) for i < 32, return L⁻¹(1<<j) for j < 32 (Gauss-Jordan over GF(2))."""
    rows = [(image, 1 << i) for i, image in enumerate(images)]  # (L(x), x) pairs
    for bit in range(LIMB_BITS):
        pivot = next(k for k in range(bit, LIMB_BITS) if rows[k][0] >> bit & 1)
        rows[bit], rows[pivot] = rows[pivot], rows[bit]
        for k in range(LIMB_BITS):
            if k != bit and rows[k][0] >> bit & 1:
                rows[k] = (rows[k][0] ^ rows[bit][0], rows[k][1] ^ rows[bit][1])
    return [x for _, x in rows]


@cache
def crc_inverse_tables() -> tuple[tuple[int, ...], ...]:
    """Four 256-entry tables: limb = T0[y & 255] ^ T1[y>>8 & 255] ^ T2[..] ^ T3[y>>24]."""
    inverse = _invert_gf2([_crc_linear_part(1 << i) for i in range(LIMB_BITS)])
    tables: list[tuple[int, ...]] = []
    for k in range(4):
        table = []
        for v in range(256):
            x = 0
            for b in range(8):
                if v >> b & 1:
                    x ^= inverse[8 * k + b]
            table.append(x)
        tables.append(tuple(table))
    for probe in (0, 1, 0x80000000, 0xDEADBEEF, LIMB_MASK, 0x01020304):
        assert limb_from_crc(zlib.crc32(probe.to_bytes(4, "big")), tables) == probe
    return tuple(tables)


def limb_from_crc(crc: int, tables: Sequence[Sequence[int]]) -> int:
    """Pure-Python twin of :func:`limb_sql` (used to check the tables)."""
    y = crc ^ _CRC_OF_ZERO
    return (
        tables[0][y & 255]
        ^ tables[1][y >> 8 & 255]
        ^ tables[2][y >> 16 & 255]
        ^ tables[3][y >> 24 & 255]
    )


def _table_sql(table: Sequence[int]) -> str:
    # A JSON string parsed by from_json folds into one array literal at planning time;
    # array(lit, lit, …) would make a 256-node expression tree per look-up, and with 32
    # look-ups per row Catalyst spends seconds rewriting them on every query.
    return "from_json('[" + ",".join(map(str, table)) + "]', 'array<bigint>')"


def _quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


def limb_sql(column: str, index: int) -> str:
    """SQL for limb ``index`` (0 = most significant) of the 32-byte binary ``column``."""
    tables = crc_inverse_tables()
    y = f"(crc32(substring({_quote(column)}, {1 + 4 * index}, 4)) ^ {_CRC_OF_ZERO})"
    lookups = [
        f"get({_table_sql(tables[k])}, cast((shiftright({y}, {8 * k}) & 255) as int))"
        for k in range(4)
    ]
    return "(" + " ^ ".join(lookups) + ")"


def hash_limbs(column: str) -> list[Column]:
    """The eight unsigned 32-bit big-endian limbs of a 32-byte binary column, as longs."""
    return [sf.expr(limb_sql(column, i)) for i in range(LIMBS)]


def limb_names(prefix: str = "s") -> list[str]:
    return [f"{prefix}{i}" for i in range(LIMBS)]
