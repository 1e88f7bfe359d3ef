"""The ``litekiln`` command line: a thin layer over the Python API.

litekiln compile MODEL... [--cache-dir D] [--precision fp16]   compile ahead of time
litekiln run MODEL [--inputs in.npz] [--save out.npz]          run once, print outputs
litekiln inspect MODEL                                          what runs where, and why
litekiln cache ls|info|verify|prune|clear|export|import         manage the cache
litekiln bench --startup MODEL...                               cold vs warm start-up
litekiln devices                                                list OpenCL devices
litekiln config                                                 every setting and its value

Options go anywhere after the command's name; ``-v`` anywhere at all.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from collections.abc import Iterator
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
    writes_nothing,
)
from litekiln.cli.common import (
    CACHE_EXAMPLES,
    EPILOG,
    HelpFormatter,
    add_global_options,
    check_environment,
    cli_logging,
    examples,
    read_only_environment,
    stdout_to_devnull,
)

#: Exit status after a broken pipe: that of a process killed by SIGPIPE (128 + 13), as
#: `cat` or `grep` report it under `set -o pipefail`.
EXIT_BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    """The ``litekiln`` parser: one subcommand per ``cmd_*`` function (its ``func`` default)."""
    from litekiln import __version__

    p = argparse.ArgumentParser(
        prog="litekiln",
        description="Ahead-of-time GPU compiler and loader for TensorFlow Lite models: compiles a "
        ".tflite model's GPU-capable ops to OpenCL kernels once, caches them, and runs them "
        "with a lightweight runtime; other ops run on the CPU.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"litekiln {__version__}")
    add_global_options(p, top_level=True)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    add_compile_parser(sub)
    add_run_parser(sub)
    add_inspect_parser(sub)
    add_cache_parser(sub)
    add_bench_parser(sub)
    add_devices_parser(sub)
    add_config_parser(sub)
    _finish_subcommands(p)
    return p


def _finish_subcommands(parser: argparse.ArgumentParser, path: str = "") -> None:
    """What every (sub)command's parser shares, applied through the whole tree.

    * a command's options hold for its subcommands too, in any position after their names
      (``litekiln -v inspect`` = ``litekiln inspect -v``; ``litekiln cache ls --cache-dir D``
      = ``litekiln cache --cache-dir D ls``), unless the subcommand has its own;
    * help keeps examples as written (`HelpFormatter`), and the cache actions get the
      examples of `CACHE_EXAMPLES` where they have none of their own.
    """
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, child in action.choices.items():
            _inherit_options(parser, child)
            child.formatter_class = HelpFormatter
            words = [*path.split(), name]
            cache_action = " ".join(words[1:])
            if child.epilog is None and words[0] == "cache" and cache_action in CACHE_EXAMPLES:
                child.epilog = examples(CACHE_EXAMPLES[cache_action])
            _finish_subcommands(child, " ".join(words))


def _inherit_options(parent: argparse.ArgumentParser, child: argparse.ArgumentParser) -> None:
    """Copy `parent`'s options (but help and version) into `child`, set only when given there:
    argparse copies a subcommand's values over its parent's, so a default would undo
    ``litekiln cache --cache-dir D ls``."""
    taken = set(child._option_string_actions)
    for action in parent._actions:
        if not action.option_strings or isinstance(
            action, (argparse._HelpAction, argparse._VersionAction)
        ):
            continue
        if taken.intersection(action.option_strings):
            continue
        twin = copy.copy(action)
        twin.default = argparse.SUPPRESS
        child._add_action(twin)


def main(argv: list[str] | None = None) -> int:
    """Run one ``litekiln`` command line; returns the exit status.

    Argument errors end in argparse's usage line and ``error: ...`` (exit 2, raised as
    SystemExit), litekiln's own errors in ``litekiln: error: ...`` (exit 1); a reader that goes
    away (``| head``) ends the command quietly (exit 141).
    """
    parser = build_parser()
    a, extra = parser.parse_known_args(argv)
    if extra:  # told by the command's own parser, with its usage line, not the top level's
        _command_parser(parser, a).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    if a.cmd != "config":  # config shows an unreadable setting instead of failing on it
        problem = check_environment()
        if problem:
            print(f"litekiln: error: {problem}", file=sys.stderr)
            return 2
    try:
        with cli_logging(a.verbose), _side_effects(a):
            status = int(a.func(a) or 0)
            sys.stdout.flush()  # a broken pipe shows here, inside the handler below
        return status
    except BrokenPipeError:
        stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    except LitekilnError as exc:
        print(f"litekiln: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _command_parser(
    parser: argparse.ArgumentParser, a: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the (sub)command `a` was parsed by (``litekiln cache ls``: ls's)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            child = action.choices.get(getattr(a, action.dest, None) or "")
            if child is not None:
                return _command_parser(child, a)
    return parser


@contextlib.contextmanager
def _side_effects(a: argparse.Namespace) -> Iterator[None]:
    """A command that stores nothing (`writes_nothing`) runs in a read-only environment."""
    if writes_nothing(a):
        with read_only_environment():
            yield
    else:
        yield
