"""Sizes, times and rates as written in cluster files, and their exact round trip."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensoropt.cluster.units import fmt_rate, fmt_size, fmt_time, parse_rate, parse_size, parse_time
from tensoropt.errors import ClusterSpecError

W = "c.yaml: devices[0].memory"


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("24 GiB", 24 * 2**30), ("16GB", 16 * 10**9), ("512MiB", 512 * 2**20),
    ("1.5KiB", 1536), ("2kB", 2000), ("1e9", 10**9), (1e9, 10**9), ("123", 123), (123, 123), ("7B", 7),
])
def test_parse_size(text, expected):
    assert parse_size(text, W) == expected


@pytest.mark.parametrize("text, expected", [
    ("10us", 1e-5), ("10 µs", 1e-5), ("10 μs", 1e-5), ("1.5ms", 1.5e-3), ("2s", 2.0), ("0.001", 1e-3),
    (0.25, 0.25), ("30ns", 3e-8), ("0", 0.0),
])
def test_parse_time(text, expected):
    assert parse_time(text, W) == expected        # exact, not approx: the decimal point just moves


@pytest.mark.parametrize("text, expected", [
    ("12GB/s", 12e9), ("12 GiB/s", 12 * 2**30), ("25Gb/s", 25e9 / 8), ("100Mb/s", 100e6 / 8),
    ("10Gbps", 1.25e9), ("5e8", 5e8), (1000, 1000.0),
])
def test_parse_rate(text, expected):
    assert parse_rate(text, W) == expected


@pytest.mark.parametrize("fn, value, fragments", [
    (parse_size, "24 Gb", ["c.yaml: devices[0].memory", "unknown size unit 'Gb'", "bytes: B, not bits"]),
    (parse_size, "24G", ["unknown size unit 'G'", "GiB"]),
    (parse_size, "-1GB", ["must not be negative"]),
    (parse_size, "0", ["must be positive"]),
    (parse_size, "lots", ["'lots' is not a number"]),
    (parse_size, [24], ["must be a number or a string", "list"]),
    (parse_size, True, ["bool"]),
    (parse_time, "10 minutes", ["unknown time unit 'minutes'", "us (or µs)"]),
    (parse_time, "-5us", ["must not be negative"]),
    (parse_time, float("nan"), ["finite"]),
    (parse_rate, "12GB", ["unknown rate unit 'GB'", "GB/s"]),
    (parse_rate, "0GB/s", ["must be positive"]),
    (parse_rate, "1e400", ["too large"]),
])
def test_errors_name_the_field_and_the_cause(fn, value, fragments):
    with pytest.raises(ClusterSpecError) as e:
        fn(value, W)
    msg = str(e.value)
    assert msg.startswith(W)
    for f in fragments:
        assert f in msg


def test_zero_allowed_where_asked():
    assert parse_time("0us", W) == 0.0                       # a zero latency is fine
    assert parse_size("0", W, allow_zero=True) == 0
    with pytest.raises(ClusterSpecError, match="must be positive"):
        parse_time("0us", W, allow_zero=False)


@pytest.mark.parametrize("fn, value, text", [
    (fmt_size, 24 * 2**30, "24GiB"), (fmt_size, 16 * 10**9, "16GB"), (fmt_size, 1536 * 2**20, "1.5GiB"),
    (fmt_size, 123, "123B"),
    (fmt_time, 1e-5, "10us"), (fmt_time, 1.5e-3, "1.5ms"), (fmt_time, 2.0, "2s"), (fmt_time, 3e-8, "30ns"),
    (fmt_time, 0.0, "0s"),
    (fmt_rate, 12e9, "12GB/s"), (fmt_rate, 25e9 / 8, "3.125GB/s"), (fmt_rate, 500.0, "500B/s"),
])
def test_formatting_is_human(fn, value, text):
    assert fn(value) == text


@given(st.integers(min_value=1, max_value=2**60))
def test_size_round_trip_is_exact(n):
    assert parse_size(fmt_size(n), "x") == n


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_time_round_trip_is_exact(t):
    assert parse_time(fmt_time(t), "x") == t


@given(st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_rate_round_trip_is_exact(r):
    s = fmt_rate(r)
    assert parse_rate(s, "x") == r and not math.isnan(parse_rate(s, "x"))
