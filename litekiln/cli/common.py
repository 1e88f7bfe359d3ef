"""What the commands share: options and their types, examples, JSON output, logging, a
read-only environment, sizes and ages in words."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


JSON_HELP = "machine-readable output"
VERBOSE_HELP = (
    "also show litekiln's progress (info log) and the peer libraries' own logs (LiteRT, "
    "TFLite, absl, Vulkan/WebGPU), which are silenced otherwise"
)


EPILOG = """\
examples:
  litekiln compile face_detection.tflite --cache-dir build/litekiln-cache
  litekiln run face_detection.tflite --save out.npz
  litekiln run model.tflite --device reference          # numpy reference, no OpenCL
  litekiln inspect model.tflite --json
  litekiln cache ls
  litekiln bench --startup models/zoo/*.tflite

Every command has its own --help with examples; options go anywhere after the command.
environment: LITEKILN_DEVICE, LITEKILN_CACHE_DIR, LITEKILN_PRECISION ... (`litekiln config`)
"""

#: Examples of the ``cache`` command and its actions, by action ("" for ``cache`` itself);
#: `litekiln.cli.main` gives them to the parsers that have none of their own.
CACHE_EXAMPLES = {
    "": """\
  litekiln cache ls
  litekiln cache verify --fix                 # drop damaged entries
  litekiln cache prune --max-size 500M
  litekiln cache export app-cache.tar --sign-key build.key
""",
    "ls": "  litekiln cache ls\n  litekiln cache ls --json --cache-dir build/litekiln-cache\n",
    "info": "  litekiln cache info face_detection.tflite   # by model file, token or key prefix\n"
    "  litekiln cache info dd31aa6841afdfa1 --json\n",
    "verify": "  litekiln cache verify\n  litekiln cache verify --fix --json\n",
    "prune": "  litekiln cache prune --max-size 500M\n  litekiln cache prune --older-than 30d\n",
    "clear": "  litekiln cache clear --cache-dir build/litekiln-cache\n",
    "export": "  litekiln cache export app-cache.tar --sign-key build.key\n"
    "  litekiln cache export one.tar 3f2a9c --unsigned\n",
    "import": "  litekiln cache import app-cache.tar --trusted-key build.key.pub\n",
    "keygen": "  litekiln cache keygen build.key            # build.key (0600) and build.key.pub\n",
}


def examples(text: str) -> str:
    """An epilog of examples (lines indented by two spaces, as typed in a shell)."""
    return "examples:\n" + text


def add_global_options(p: argparse.ArgumentParser, *, top_level: bool = False) -> None:
    """Options every command takes, before or after its name (``-v``).

    The top-level parser holds the default; a command's own copy sets the value only when
    given (argparse copies a subcommand's defaults over the top level's).
    """
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help=VERBOSE_HELP,
    )


# ---------------------------------------------------------------------------- option types
# Each raises argparse.ArgumentTypeError: argparse turns it into the command's usage line,
# "error: argument --X: ..." and exit status 2.


def existing_file(text: str) -> str:
    """A path that names an existing file (models, input .npz files)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"not a file: {text!r}")
    return text


def output_file(text: str) -> str:
    """A file to write, in a directory that exists (checked before any work is done)."""
    parent = Path(text).expanduser().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: directory {str(parent)!r} does not exist")
    return text


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer type with a lower bound (``--runs``, ``--seed``, ``--max-partitions``)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def positive_float(text: str) -> float:
    """A number above 0 (``--peak-gbps``)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return v


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, where text written with line breaks (the examples) is kept as written
    and a one-paragraph text (a description) is wrapped to the terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip("\n"):
            return super()._fill_text(text, width, indent)
        return argparse.HelpFormatter._fill_text(self, text, width, indent)


def add_model_options(p: argparse.ArgumentParser) -> None:
    add_cache_dir_option(p)
    p.add_argument("--precision", choices=["fp32", "fp16"], help="kernel precision (default fp32)")
    p.add_argument(
        "--device", help="OpenCL device: gpu, cpu, opencl, P:D, a name substring, or 'reference'"
    )
    p.add_argument("--token", help="model token (default: farmhash Fingerprint64 of the file)")
    p.add_argument(
        "--op-table",
        choices=["documented", "extended"],
        help="GPU op table: extended (default, LITEKILN_OP_TABLE: every op litekiln's GPU "
        "path runs) or documented (the TFLite GPU delegate's documented table)",
    )
    p.add_argument(
        "--max-partitions",
        type=int_at_least(0),
        metavar="N",
        help="most GPU partitions to delegate (default LITEKILN_MAX_PARTITIONS, 0: no cap; "
        "small partitions between CPU ops go to the CPU when a round trip costs more)",
    )
    p.add_argument(
        "--no-quantized", action="store_true", help="run quantized op versions on the CPU"
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="do not read or write the cache (nor the OpenCL driver's): nothing is stored",
    )
    p.add_argument(
        "--fp16-budget",
        type=_budget,
        metavar="ERR|off",
        help="with --precision fp16: the largest simulated error (relative to max(1, "
        "max|output|)) the compiler accepts before it keeps the most sensitive tensors in "
        "float32 (default 2.5e-3; 'off': every tensor in half, unchecked; see docs/precision.md). "
        "Part of the cache key: give the app the same value",
    )


def _budget(text: str) -> float | str:
    if text.lower() in ("off", "none"):
        return "off"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1) or 'off', got {text!r}"
        ) from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1) or 'off', got {text!r}")
    return v


def interpreter_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("cache_dir", "precision", "device"):
        if getattr(a, name, None):
            kw[name] = getattr(a, name)
    if getattr(a, "token", None):
        kw["model_token"] = a.token
    if getattr(a, "op_table", None):
        kw["op_table"] = a.op_table
    if getattr(a, "max_partitions", None) is not None:
        kw["max_partitions"] = a.max_partitions
    if getattr(a, "no_quantized", False):
        kw["allow_quantized"] = False
    if getattr(a, "no_cache", False):
        kw["use_cache"] = False
    budget = getattr(a, "fp16_budget", None)
    if budget is not None:
        kw["fp16_budget"] = None if budget == "off" else budget
    return kw


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=json_default))


def json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def age_in_words(seconds: float) -> str:
    s = max(0.0, time.time() - seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def add_cache_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir", help="cache directory (default: $LITEKILN_CACHE_DIR or the XDG cache dir)"
    )


def add_json_option(p: argparse.ArgumentParser, help_text: str | None = JSON_HELP) -> None:
    p.add_argument("--json", action="store_true", help=help_text)


# ---------------------------------------------------------------------------- environment


def check_environment() -> str | None:
    """Why a ``LITEKILN_*`` variable cannot be read (the first such), or None."""
    from litekiln import config

    for setting in config.SETTINGS:
        try:
            setting.get()
        except ValueError as exc:
            return f"{exc} (`litekiln config` lists every setting)"
    return None


class _CurrentStderr(logging.Handler):
    """Writes each record to ``sys.stderr`` as it is when the record comes (a redirect, a
    test's capture), as Python's last-resort handler does."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


@contextlib.contextmanager
def cli_logging(verbose: bool) -> Iterator[None]:
    """litekiln's log on stderr while a command runs: info and above with ``-v``, else the
    level of ``LITEKILN_LOG`` (default warning). The logger is as before afterwards."""
    from litekiln import config

    logger = logging.getLogger("litekiln")
    saved = logger.level
    handler = _CurrentStderr()
    logger.setLevel("INFO" if verbose else config.LOG_LEVEL.get().upper())
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


@contextlib.contextmanager
def read_only_environment() -> Iterator[None]:
    """Keep the OpenCL stack from storing anything while a read-only command runs.

    pyopencl keeps an invoker cache under the user's cache directory unless
    ``PYOPENCL_NO_CACHE`` is set when it is imported; the drivers keep compiled kernels unless
    told not to (`DRIVER_CACHES_OFF`); and PoCL writes a scratch file into its cache
    directory at start-up even with its kernel cache off, so that directory points into a
    temporary folder that goes when the command ends. A library that has already started in
    this process keeps its settings (the commands import them lazily, so a CLI process has
    not).
    """
    from litekiln.runtime.profile import DRIVER_CACHES_OFF, driver_scratch_env

    scratch = tempfile.mkdtemp(prefix="litekiln-scratch-")
    env = {"PYOPENCL_NO_CACHE": "1", **DRIVER_CACHES_OFF, **driver_scratch_env(scratch)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        session = sys.modules.get("litekiln.runtime.session")
        if session is not None:
            # Background work (tuning, a build) may still be in the driver, which writes
            # into the scratch folder: it ends (tuning stops at its next variant) first.
            session.join_background()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(scratch, ignore_errors=True)


def stdout_to_devnull() -> None:
    """After a broken pipe (``litekiln ... | head``): point fd 1 at /dev/null so that Python's
    final flush at exit finds somewhere to write instead of printing a second traceback."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing to flush at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
