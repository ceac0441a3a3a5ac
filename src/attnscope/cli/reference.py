"""Subcommands of the `attnscope` CLI for this layer (being written)."""

from __future__ import annotations


def configure(sub) -> None:
    """Add this module's subcommands to `sub` (argparse subparsers)."""
