"""``litekiln cache``: list, inspect, verify, prune, clear, export and import cache entries,
and make the key pair that signs exports.

Every action prints a short human summary; ``--json`` gives the full record. Options
(``--cache-dir``, ``--json``) are accepted before or after the action. Actions that only
read (and prune/clear) never create a cache directory that does not exist.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litekiln.cache import CacheStore

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


def parse_size_arg(text: str) -> int:
    """``"500M"``, ``"2G"``, ``"0"`` -> bytes; anything else is an argparse error."""
    from litekiln.config import parse_size

    try:
        size = parse_size(text)
    except ValueError:
        size = -1
    if size < 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 0, 500M, 2G)")
    return size


# ---------------------------------------------------------------- the actions


def cmd_cache(a: argparse.Namespace) -> int:
    action = _ACTIONS[a.cache_cmd]
    if a.cache_cmd == "keygen":
        return action(None, a)
    from litekiln.cache import CacheStore, default_cache_dir

    directory = Path(a.cache_dir).expanduser() if a.cache_dir else default_cache_dir()
    if a.cache_cmd != "import" and not os.path.lexists(directory):
        return _no_cache(directory, a)
    with CacheStore.open(directory) as store:
        return action(store, a)


def _no_cache(directory: Path, a: argparse.Namespace) -> int:
    """A command on a cache directory that does not exist: nothing to do, nothing created."""
    from litekiln.cache import CacheError

    if a.cache_cmd in ("info", "export"):
        raise CacheError(f"no cache at {directory} (the directory does not exist)")
    if getattr(a, "json", False):
        print_json({"directory": str(directory), "exists": False, "entries": []})
    else:
        print(f"{directory}: no cache here (the directory does not exist)")
    return 0


def _ls(store: CacheStore, a: argparse.Namespace) -> int:
    rows = store.ls()
    if a.json:
        print_json({"directory": str(store.directory), "entries": [r.as_dict() for r in rows]})
        return 0
    total = human_size(sum(r.size for r in rows))
    print(f"{store.directory}: {len(rows)} entries, {total}{_state(store)}")
    for r in rows:
        print(f"  {_line(r.as_dict())}")
    return 0


def _state(store: CacheStore) -> str:
    if not store.enabled:
        return f" (disabled: {store.reason})"
    return f" (read-only: {store.reason})" if store.read_only else ""


def _line(r: dict[str, Any]) -> str:
    """One entry in words: key, kind, size (with the shared constants it needs) and its share
    of the model file, last use, model, and device or options."""
    size = human_size(r["size"] + (r.get("shared_size") or 0))
    used = age_in_words(r["last_use"])
    return (
        f"{r['key'][:12]}  {r['kind']:7s} {size:>10s} {_share(r):>14s}  {used:8s}  "
        f"{_model(r)}  {_where(r)}"
    ).rstrip()


def _share(r: dict[str, Any]) -> str:
    """``"4.2% of model"`` for a compiled model that recorded its model's size, else ``""``."""
    share = r.get("model_share")
    if share is None:
        return ""
    return f"{100 * share:.1f}% of model" if share < 10 else f"{share:.0f}x model"


def _model(r: dict[str, Any]) -> str:
    name, token = r.get("model_name"), r.get("token")
    if name and token:
        return f"{name} (token {token})"
    if name or token:
        return f"{name or 'token ' + str(token)}"
    return "model not recorded"


def _where(r: dict[str, Any]) -> str:
    if r["kind"] == "weights":
        fields = r.get("fields") or {}
        return f"constant {fields.get('dtype')} {fields.get('shape')} shared by compiled models"
    if r["kind"] == "device":
        fields = r.get("fields") or {}
        return f"GPU record of device choice {fields.get('choice', '')!r}: {r.get('device') or '?'}"
    if r["kind"] == "program":
        fields = r.get("fields") or {}
        device = r.get("device") or fields.get("name") or "unknown device"
        platform = fields.get("platform")
        return f"binary for {device}" + (f" ({platform})" if platform else "")
    opts = r.get("options") or {}
    if not isinstance(opts, dict):
        return ""
    keys = ("precision", "op_table", "schedules", "target")
    return ", ".join(f"{k}={opts[k]}" for k in keys if opts.get(k) is not None)


def _info(store: CacheStore, a: argparse.Namespace) -> int:
    from litekiln.cache import CacheError

    infos, by_key = _find(store, a.query)
    if not infos:
        raise CacheError(
            f"no cache entry matches {a.query!r} (a model token, a model file or a key prefix) "
            f"in {store.directory}"
        )
    if a.json:
        print_json(infos[0] if by_key else infos)
        return 0
    for info in infos:
        if "problem" in info:
            print(f"{info['key'][:12]}  damaged: {info['problem']}")
            continue
        print(_line(info))
        print(f"  key      {info['key']}")
        print(f"  created  {age_in_words(info['created'])}")
        parts = info.get("parts", [])
        print(f"  parts    {len(parts)} ({human_size(sum(p['size'] for p in parts))})")
        meta = info.get("meta") or {}
        if info.get("model_bytes"):
            shared = info.get("shared_size") or 0
            needs = len(meta.get("needs") or [])
            print(
                f"  size     {human_size(info['size'] + shared)}"
                + (f" ({human_size(shared)} in {needs} shared constants)" if needs else "")
                + f": {100 * info['model_share']:.1f}% of the model's "
                f"{human_size(info['model_bytes'])}"
            )
        versions = meta.get("versions")
        if isinstance(versions, dict) and versions:
            print("  made by  " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    return 0


def _find(store: CacheStore, query: str) -> tuple[list[dict[str, Any]], bool]:
    """The entries `query` names: a model file (its token), a model token, or a key prefix.

    Returns:
        (their `CacheStore.info` records, whether `query` was a key prefix).
    """
    from litekiln.cache import CacheError
    from litekiln.model.token import made_from, model_token

    token = model_token(Path(query).read_bytes()) if os.path.isfile(query) else query
    # (a model's entries include those of its resized shapes and of its other signatures)
    matches = [s.key for s in store.ls() if s.token is not None and made_from(str(s.token), token)]
    if matches:
        return [store.info(k) for k in matches], False
    try:
        return [store.info(query)], True
    except KeyError as e:
        if "ambiguous" in str(e.args[0]):
            raise CacheError(f"{e.args[0]} in {store.directory}") from None
        return [], True


def _verify(store: CacheStore, a: argparse.Namespace) -> int:
    report = store.verify(fix=a.fix)
    if a.json:
        print_json(report.as_dict())
    else:
        _print_report(store, report)
    return 0 if report.clean or report.fixed else 1


def _print_report(store: CacheStore, report: Any) -> None:
    state = "all good" if report.clean else "problems found"
    print(f"{store.directory}: {report.entries} entries checked, {state}{_state(store)}")
    done = "dropped" if report.fixed else "run with --fix to drop it"
    for key, problem in report.bad.items():
        print(f"  bad entry {key[:12]}: {problem} ({done})")
    if report.orphan_parts:
        what = "old ones deleted" if report.fixed else "collected as they age, or by --fix"
        print(f"  {report.orphan_parts} orphan parts no entry references ({what})")
    for problem in report.storage:
        print(f"  storage: {problem}")


def _prune(store: CacheStore, a: argparse.Namespace) -> int:
    removed = store.prune(
        max_size=a.max_size,
        older_than=a.older_than,
    )
    if a.json:
        print_json({"removed": removed})
    else:
        print(f"removed {len(removed)} entries from {store.directory}")
    return 0


def _clear(store: CacheStore, a: argparse.Namespace) -> int:
    n = store.clear()
    print(f"removed {n} entries from {store.directory}")
    return 0


def _export(store: CacheStore, a: argparse.Namespace) -> int:
    from litekiln.cache import CacheError

    try:
        keys = store.export(a.file, keys=a.keys or None, sign_key=a.sign_key, unsigned=a.unsigned)
    except KeyError as exc:
        raise CacheError(f"{exc.args[0]} in {store.directory}") from None
    how = "unsigned" if a.unsigned and not (a.sign_key or _default_key()) else "signed"
    print(f"exported {len(keys)} entries to {a.file} ({how})")
    return 0


def _default_key() -> str:
    from litekiln import config

    return config.SIGN_KEY.get()


def _import(store: CacheStore, a: argparse.Namespace) -> int:
    keys = store.import_(a.file, trusted_keys=a.trusted_key, trust=a.trust)
    print(f"imported {len(keys)} verified entries into {store.directory}")
    return 0


def _keygen(store: None, a: argparse.Namespace) -> int:
    from litekiln.cache.signing import fingerprint, generate_key, public_pem

    public_path, public = generate_key(a.out)
    print(f"private key: {a.out} (mode 0600; it signs exports: keep it on the build machine)")
    print(f"public key:  {public_path} ({fingerprint(public)})")
    print(public_pem(public).rstrip())
    print(
        f"sign with `litekiln cache export FILE --sign-key {a.out}` (or LITEKILN_SIGN_KEY); "
        f"importers trust it with LITEKILN_TRUSTED_KEYS={public_path} or --trusted-key"
    )
    return 0


_ACTIONS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "ls": _ls,
    "info": _info,
    "verify": _verify,
    "prune": _prune,
    "clear": _clear,
    "export": _export,
    "import": _import,
    "keygen": _keygen,
}


# ---------------------------------------------------------------- the parser


def add_cache_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "cache",
        help="manage the compiled-model cache",
        description="List, check, shrink, empty, export and import the cache; make the key "
        "pair that signs exports.",
    )
    add_cache_dir_option(p)
    actions = p.add_subparsers(dest="cache_cmd", metavar="ACTION", required=True)
    _add_cache_actions(actions)
    for action in actions.choices.values():
        action.set_defaults(func=cmd_cache)
    p.set_defaults(func=cmd_cache)


def _action(
    actions: _Subcommands, name: str, help_text: str, json: bool = False
) -> argparse.ArgumentParser:
    p = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:])
    # Also after the action; SUPPRESS keeps the value given before it when not repeated.
    p.add_argument("--cache-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    if json:
        add_json_option(p, help_text="the full record, as JSON")
    return p


def _add_cache_actions(actions: _Subcommands) -> None:
    _action(
        actions,
        "ls",
        "list entries: kind, size and share of the model's size, last use, model, device",
        json=True,
    )
    p = _action(actions, "info", "show the entries of a model, or one entry", json=True)
    p.add_argument(
        "query",
        metavar="TOKEN|MODEL|KEY",
        help="a model token (as `litekiln inspect` prints it), a model file, or a key prefix; "
        "with --json: a list for a model, one record for a key",
    )
    p = _action(actions, "verify", "check every entry's signature and checksums", json=True)
    p.add_argument("--fix", action="store_true", help="drop damaged entries and orphan parts")
    p = _action(actions, "prune", "evict least-recently-used entries", json=True)
    p.add_argument("--max-size", type=parse_size_arg, help="shrink to this size (e.g. 0, 500M, 2G)")
    p.add_argument(
        "--older-than", type=parse_age, help="drop entries unused for this long (e.g. 30d, 12h)"
    )
    _action(actions, "clear", "remove every entry")
    p = _action(actions, "export", "write entries to one signed file (to ship with an app)")
    p.add_argument("file")
    p.add_argument("keys", nargs="*", help="keys or prefixes (default: all)")
    p.add_argument(
        "--sign-key", metavar="KEY", help="private key to sign with (default: LITEKILN_SIGN_KEY)"
    )
    p.add_argument(
        "--unsigned",
        action="store_true",
        help="without a key, write an unsigned export (only `import --trust` accepts it)",
    )
    p = _action(actions, "import", "add the entries of a signed export (every part verified first)")
    p.add_argument("file")
    p.add_argument(
        "--trusted-key",
        metavar="PUB",
        action="append",
        help="a public key whose signature is accepted (repeatable; default: "
        "LITEKILN_TRUSTED_KEYS)",
    )
    p.add_argument(
        "--trust",
        action="store_true",
        help="accept an unsigned export or an unknown key: you vouch for where the file "
        "comes from (docs/security.md)",
    )
    p = actions.add_parser(
        "keygen",
        help="make a key pair that signs exports",
        description="Write a new Ed25519 private key to OUT (mode 0600) and its public key to "
        "OUT.pub, and print the public key.",
    )
    p.add_argument("out", metavar="OUT")
