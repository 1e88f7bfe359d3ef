"""The ``litekiln`` command line: a thin layer over the Python API (`litekiln.cli.main`)."""

from litekiln.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
