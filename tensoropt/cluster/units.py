"""Sizes, times and rates as people write them in cluster files: ``24GiB``, ``10us``, ``12GB/s``.

Parsing goes through :class:`decimal.Decimal`, so moving the decimal point for a unit is exact and
the only rounding is the final conversion to ``int`` / ``float``: ``parse_time(fmt_time(t)) == t``
for every finite float ``t`` (and likewise for sizes and rates).  That is what lets a cluster
written to YAML load back *equal*, float for float.

Every ``parse_*`` raises :class:`~tensoropt.errors.ClusterSpecError` whose message starts with
``where`` (e.g. ``"cluster.yaml: links.groups[0].bandwidth"``) and says what is wrong and which
units are accepted.

It must not know about devices or links: strings ↔ numbers only.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal, InvalidOperation

from ..errors import ClusterSpecError

# binary units (IEC) are powers of two, decimal ones (SI) powers of ten; B alone is a byte
SIZE_UNITS: dict[str, int] = {
    "": 1, "B": 1,
    "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50,
}
TIME_UNITS: dict[str, Decimal] = {
    "": Decimal(1), "s": Decimal(1), "ms": Decimal("1e-3"),
    "us": Decimal("1e-6"), "\u00b5s": Decimal("1e-6"), "\u03bcs": Decimal("1e-6"),  # micro sign, Greek mu
    "ns": Decimal("1e-9"),
}
# rates: bytes per second (B) or bits per second (b, divided by 8); network gear is sold in bits
_RATE_PREFIX: dict[str, int] = {"": 1, "K": 10**3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                                "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
RATE_UNITS: dict[str, Decimal] = {"": Decimal(1)}
for _p, _m in _RATE_PREFIX.items():
    RATE_UNITS[f"{_p}B/s"] = Decimal(_m)
    RATE_UNITS[f"{_p}b/s"] = Decimal(_m) / 8
    if not _p.endswith("i"):
        RATE_UNITS[f"{_p}bps"] = Decimal(_m) / 8
        RATE_UNITS[f"{_p}Bps"] = Decimal(_m)
del _p, _m

# 60 digits: a float's repr has at most 17 significant digits, units add at most 16 more, so every
# product below is exact and the only rounding left is Decimal → float / int
_CTX = Context(prec=60)
_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*)\s*$")


def _split(v: object, where: str, example: str) -> tuple[Decimal, str]:
    """``v`` (number or string) → (exact decimal number, unit text)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ClusterSpecError(f"{where}: must be a number or a string like {example!r}, "
                               f"got {type(v).__name__} {v!r}")
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            raise ClusterSpecError(f"{where}: must be a finite number, got {v!r}")
        return Decimal(repr(v)) if isinstance(v, float) else Decimal(v), ""
    m = _NUMBER_UNIT.match(v)
    if not m:
        raise ClusterSpecError(f"{where}: {v!r} is not a number with an optional unit (like {example!r})")
    try:
        return Decimal(m.group(1)), m.group(2)
    except InvalidOperation:  # pragma: no cover - the regex only lets decimal numbers through
        raise ClusterSpecError(f"{where}: {v!r} is not a number") from None


def _check_sign(x: Decimal, v: object, where: str, allow_zero: bool) -> None:
    if x < 0:
        raise ClusterSpecError(f"{where}: must not be negative, got {v!r}")
    if x == 0 and not allow_zero:
        raise ClusterSpecError(f"{where}: must be positive, got {v!r}")


def parse_size(v: object, where: str, *, allow_zero: bool = False) -> int:
    """Bytes from ``24GiB``, ``24 GiB``, ``16GB``, ``512MiB``, ``1e9`` or ``123``.

    KiB/MiB/GiB/TiB are binary (2**10 …), KB/MB/GB/TB decimal (10**3 …); the ``B`` is optional
    only for a bare number (bytes).  The result is rounded to a whole byte.  Zero is refused unless
    ``allow_zero`` (a device with no memory is a mistake).
    """
    x, unit = _split(v, where, "24GiB")
    if unit not in SIZE_UNITS:
        hint = " (sizes are in bytes: B, not bits: b)" if unit.endswith("b") else ""
        raise ClusterSpecError(f"{where}: unknown size unit {unit!r} in {v!r}{hint}; use one of "
                               f"{', '.join(u for u in SIZE_UNITS if u)} or a bare number of bytes")
    _check_sign(x, v, where, allow_zero)
    exact = _CTX.multiply(x, Decimal(SIZE_UNITS[unit]))
    if exact > Decimal(2) ** 80:
        raise ClusterSpecError(f"{where}: {v!r} is implausibly large for a size in bytes")
    n = int(exact.to_integral_value())
    if n == 0 and not allow_zero:
        raise ClusterSpecError(f"{where}: must be at least one byte, got {v!r}")
    return n


def parse_time(v: object, where: str, *, allow_zero: bool = True) -> float:
    """Seconds from ``10us``, ``10 µs``, ``1.5ms``, ``2s``, ``30ns`` or a bare number (seconds)."""
    x, unit = _split(v, where, "10us")
    if unit not in TIME_UNITS:
        raise ClusterSpecError(f"{where}: unknown time unit {unit!r} in {v!r}; use s, ms, us (or µs), ns "
                               "or a bare number of seconds")
    _check_sign(x, v, where, allow_zero)
    return _to_float(_CTX.multiply(x, TIME_UNITS[unit]), v, where)


def parse_rate(v: object, where: str, *, allow_zero: bool = False) -> float:
    """Bytes per second from ``12GB/s``, ``12 GiB/s``, ``25Gb/s`` (bits: divided by 8),
    ``100Mbps``, or a bare number (bytes per second).  Zero is refused unless ``allow_zero``."""
    x, unit = _split(v, where, "12GB/s")
    if unit not in RATE_UNITS:
        raise ClusterSpecError(f"{where}: unknown rate unit {unit!r} in {v!r}; use B/s, KB/s, MB/s, GB/s, "
                               "GiB/s … (bytes) or Mb/s, Gb/s, Gbps … (bits), or a bare number of bytes/s")
    _check_sign(x, v, where, allow_zero)
    return _to_float(_CTX.multiply(x, RATE_UNITS[unit]), v, where)


def _to_float(x: Decimal, v: object, where: str) -> float:
    f = float(x)
    if not math.isfinite(f):
        raise ClusterSpecError(f"{where}: {v!r} is too large")
    return f


# ---- formatting: the shortest unit-ful string that parses back to the same value -------------

def _shift(x: float | int, digits: int) -> str:
    """``x`` divided by 10**digits, written exactly in plain decimal notation (no exponent)."""
    d = (Decimal(repr(x)) if isinstance(x, float) else Decimal(x)).scaleb(-digits, _CTX).normalize(_CTX)
    s = format(d, "f")
    return s


def fmt_size(n: int) -> str:
    """``25769803776`` → ``"24GiB"``, ``16000000000`` → ``"16GB"``; exact: the largest unit (binary
    or decimal) in which ``n`` has at most three decimals, else plain bytes."""
    if n < 0:
        raise ValueError(f"size must be non-negative, got {n}")
    for unit in ("PiB", "PB", "TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB"):
        m = SIZE_UNITS[unit]
        if n >= m and (n * 1000) % m == 0:
            q = Decimal(n * 1000 // m).scaleb(-3).normalize(_CTX)
            return f"{format(q, 'f')}{unit}"
    return f"{n}B"


def fmt_time(s: float) -> str:
    """``1e-05`` → ``"10us"``; exact (the decimal point moves, nothing is rounded)."""
    if not math.isfinite(s):
        return "inf" if s > 0 else repr(s)
    if s == 0:
        return "0s"
    a = abs(s)
    for unit, digits in (("s", 0), ("ms", -3), ("us", -6)):
        if a >= 10.0 ** digits:
            return _shift(s, digits) + unit
    return _shift(s, -9) + "ns"


def fmt_rate(bps: float) -> str:
    """``1.2e10`` → ``"12GB/s"`` (decimal units, as link speeds are quoted); exact."""
    if not math.isfinite(bps):
        return "inf" if bps > 0 else repr(bps)
    if bps == 0:
        return "0B/s"
    a = abs(bps)
    for unit, digits in (("TB/s", 12), ("GB/s", 9), ("MB/s", 6), ("KB/s", 3)):
        if a >= 10.0 ** digits:
            return _shift(bps, digits) + unit
    return _shift(bps, 0) + "B/s"
