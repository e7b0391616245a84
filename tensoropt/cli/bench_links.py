"""Placeholder while the command is written (issue 3); replaced in this change."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    return None
