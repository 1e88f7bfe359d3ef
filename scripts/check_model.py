#!/usr/bin/env python3
"""Compare litekiln with LiteRT on whole models: max|ours - LiteRT| / max(1, max|LiteRT|).

    scripts/check_model.py MODEL... [--device reference|gpu|...] [--precision fp16] [--json]

Exit status 1 if any model is outside its tolerance (litekiln/check.py holds them, with
reasons). Models LiteRT cannot run (MediaPipe custom ops) are reported and skipped. A model
whose signatures run other subgraphs (litert-torch's generative models: ``decode`` beside
``prefill``) is checked on each of those too, a line ``model[key]`` each. ``--warm`` checks
each again from the cache the first check filled, a line ``model (warm)`` each: a warm start
rebuilds the programs' constants from the model file and loads the stored programs, which a
first start does not exercise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from litekiln.check import check_model


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("models", nargs="+")
    p.add_argument("--device", help="reference, gpu, opencl, P:D or a name substring")
    p.add_argument("--precision", choices=["fp32", "fp16"])
    p.add_argument("--cache-dir")
    p.add_argument("--no-cache", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--warm", action="store_true", help="check again from the filled cache")
    a = p.parse_args()
    kw = {
        k: v
        for k, v in (("device", a.device), ("precision", a.precision), ("cache_dir", a.cache_dir))
        if v
    }
    if a.no_cache:
        kw["use_cache"] = False
    results = []
    for m in a.models:
        for signature in [None, *_other_signatures(m)]:
            try:
                r = check_model(m, seed=a.seed, signature=signature, **kw)
            except RuntimeError as exc:  # LiteRT cannot run it (unresolved custom op)
                print(
                    f"{m}: skipped, LiteRT cannot run it: {str(exc).splitlines()[0]}",
                    file=sys.stderr,
                )
                break
            runs = [r]
            if a.warm and not a.no_cache:
                warm = check_model(m, seed=a.seed, signature=signature, **kw)
                runs.append(dataclasses.replace(warm, model=f"{warm.model} (warm)"))
            results.extend(runs)
            if not a.json:
                for r in runs:
                    print(r.line(), flush=True)
    if a.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    bad = [r for r in results if not r.ok]
    if not a.json:
        print(f"{len(results) - len(bad)}/{len(results)} models within tolerance")
    return 1 if bad else 0


def _other_signatures(path: str) -> list[str]:
    """`litekiln.loading.entry_signatures` of ``path``; none for a file litekiln cannot read."""
    from litekiln.errors import LitekilnError
    from litekiln.loading import entry_signatures
    from litekiln.model import load_model

    try:
        return entry_signatures(load_model(path, validate=False))
    except LitekilnError:
        return []


if __name__ == "__main__":
    sys.exit(main())
