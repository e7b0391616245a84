"""Argument types shared by several commands."""

from __future__ import annotations

import argparse


def degrees(text: str) -> tuple[int, ...]:
    """``--degrees 1,2,4`` → ``(1, 2, 4)``; argparse reports a bad value."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--degrees must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError("--degrees must be positive integers")
    return ks
