"""The ``litekiln`` command line: a thin layer over the Python API.

litekiln compile MODEL... [--cache-dir D] [--precision fp16]   compile ahead of time
litekiln run MODEL [--inputs in.npz] [--save out.npz]          run once, print outputs
litekiln inspect MODEL                                          what runs where, and why
litekiln cache ls|info|verify|prune|clear|export|import         manage the cache
litekiln bench --startup MODEL...                               cold vs warm start-up
litekiln devices                                                list OpenCL devices
litekiln config                                                 every setting and its value
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from litekiln.errors import LitekilnError

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
from litekiln.cli.cache import add_cache_parser
from litekiln.cli.commands import (
    add_bench_parser,
    add_compile_parser,
    add_config_parser,
    add_devices_parser,
    add_inspect_parser,
    add_run_parser,
)
from litekiln.cli.common import EPILOG


def build_parser() -> argparse.ArgumentParser:
    """The ``litekiln`` parser: one subcommand per ``cmd_*`` function (its ``func`` default)."""
    from litekiln import __version__

    p = argparse.ArgumentParser(
        prog="litekiln",
        description="Ahead-of-time GPU compiler and loader for TensorFlow Lite models: compiles a "
        ".tflite model's GPU-capable ops to OpenCL kernels once, caches them, and runs them "
        "with a lightweight runtime; other ops run on the CPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"litekiln {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    add_compile_parser(sub)
    add_run_parser(sub)
    add_inspect_parser(sub)
    add_cache_parser(sub)
    add_bench_parser(sub)
    add_devices_parser(sub)
    add_config_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    try:
        return int(a.func(a) or 0)
    except LitekilnError as exc:
        print(f"litekiln: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
