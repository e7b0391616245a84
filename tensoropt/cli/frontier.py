"""Placeholder while the command is written; replaced in this change."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    return None
