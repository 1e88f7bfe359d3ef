"""``litekiln cache``: list, inspect, verify, prune, clear, export and import cache entries."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
from litekiln.cli.common import (
    add_cache_dir_option,
    add_json_option,
    age_in_words,
    human_size,
    print_json,
)


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r} as an age (e.g. 7d, 12h, 30m)"
        ) from None


def cmd_cache(a: argparse.Namespace) -> int:
    from litekiln.cache import CacheError, CacheStore
    from litekiln.config import parse_size

    store = CacheStore.open(a.cache_dir)
    sub = a.cache_cmd
    if sub == "ls":
        rows = [s.as_dict() for s in store.ls()]
        if a.json:
            print_json({"directory": str(store.directory), "entries": rows})
            return 0
        print(f"{store.directory}: {len(rows)} entries, {human_size(sum(r['size'] for r in rows))}")
        for r in rows:
            opts = r.get("options") or {}
            desc = (
                ",".join(f"{k}={v}" for k, v in opts.items() if k in ("precision", "op_table"))
                if isinstance(opts, dict)
                else ""
            )
            ident = r.get("token") or (r.get("fields") or {}).get("name", "")
            name = r.get("model_name") or ""
            print(
                f"  {r['key'][:12]}  {r['kind']:7s} {str(ident)[:24]:24s} {str(name)[:28]:28s} "
                f"{desc:28s} {human_size(r['size']):>10s}  {age_in_words(r['last_use'])}"
            )
        return 0
    if sub == "info":
        try:
            info = store.info(a.key)
        except KeyError as exc:  # unknown or ambiguous prefix: an error, not a traceback
            raise CacheError(f"{exc.args[0]} in {store.directory}") from None
        print_json(info)
        return 0
    if sub == "verify":
        report = store.verify(fix=a.fix)
        d = report.as_dict() if hasattr(report, "as_dict") else vars(report)
        if a.json:
            print_json(d)
        else:
            print(report)
        return 0 if getattr(report, "clean", True) or a.fix else 1
    if sub == "prune":
        removed = store.prune(
            max_size=parse_size(a.max_size) if a.max_size else None,
            older_than=parse_age(a.older_than) if a.older_than else None,
        )
        if a.json:
            print_json({"removed": removed})
        else:
            print(f"removed {len(removed) if hasattr(removed, '__len__') else removed} entries")
        return 0
    if sub == "clear":
        n = store.clear()
        print(f"removed {n} entries from {store.directory}")
        return 0
    if sub == "export":
        try:
            keys = store.export(a.file, keys=a.keys or None)
        except KeyError as exc:
            raise CacheError(f"{exc.args[0]} in {store.directory}") from None
        print(f"exported {len(keys)} entries to {a.file}")
        return 0
    if sub == "import":
        keys = store.import_(a.file)
        print(f"imported {len(keys)} verified entries into {store.directory}")
        return 0
    raise AssertionError(sub)


def add_cache_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "cache",
        help="manage the compiled-model cache",
        description="List, check, shrink, empty, export and import the cache.",
    )
    add_cache_dir_option(p)
    actions = p.add_subparsers(dest="cache_cmd", metavar="ACTION", required=True)
    _add_cache_actions(actions)
    for action in actions.choices.values():
        action.set_defaults(func=cmd_cache)
    p.set_defaults(func=cmd_cache)


def _add_cache_actions(actions: _Subcommands) -> None:
    p = actions.add_parser("ls", help="list entries: token, model, options, size, last use")
    add_json_option(p, help_text=None)
    p = actions.add_parser("info", help="show one entry (a key prefix is enough)")
    p.add_argument("key")
    p = actions.add_parser("verify", help="check every stored part's checksum")
    p.add_argument("--fix", action="store_true", help="drop damaged entries")
    add_json_option(p, help_text=None)
    p = actions.add_parser("prune", help="evict least-recently-used entries")
    p.add_argument("--max-size", help="shrink to this size (e.g. 500M, 2G)")
    p.add_argument("--older-than", help="drop entries unused for this long (e.g. 30d, 12h)")
    add_json_option(p, help_text=None)
    actions.add_parser("clear", help="remove every entry")
    p = actions.add_parser("export", help="write entries to one file (to ship with an app)")
    p.add_argument("file")
    p.add_argument("keys", nargs="*", help="keys or prefixes (default: all)")
    p = actions.add_parser("import", help="add the entries of an export file (each part verified)")
    p.add_argument("file")
