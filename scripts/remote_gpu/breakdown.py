"""Where a warm start's time goes, step by step (run in a fresh process on a warm cache).

python scripts/remote_gpu/breakdown.py MODEL [--cache-dir D]
"""

from __future__ import annotations

import argparse
import json
import time

T0 = time.perf_counter()
import litekiln.interpreter  # noqa: E402

T_IMPORT = time.perf_counter() - T0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--cache-dir")
    a = p.parse_args()
    import pyopencl as cl

    from litekiln.artifact.compiled import CompileOptions
    from litekiln.cache.models import ModelCache
    from litekiln.loading import default_schedules
    from litekiln.model import load_model
    from litekiln.runtime.device import select_device
    from litekiln.runtime.session import Session

    marks: dict[str, object] = {
        "model": a.model.rsplit("/", 1)[-1],
        "import_litekiln_ms": T_IMPORT * 1e3,
    }
    t = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        marks[name] = (now - t) * 1e3
        t = now

    plats = cl.get_platforms()
    mark("get_platforms_ms")
    devs = [d for p_ in plats for d in p_.get_devices()]
    mark("get_devices_ms")
    ctx = cl.Context([devs[0]])
    mark("context_ms")
    cl.CommandQueue(ctx)
    mark("queue_ms")
    model = load_model(a.model)
    mark("parse_ms")
    handle = select_device(None)
    mark("select_device_again_ms")
    cache = ModelCache.open(a.cache_dir)
    mark("cache_open_ms")
    compiled = cache.load_model(
        model.token, CompileOptions(schedules=default_schedules(handle)), model
    )
    mark("cache_load_model_ms")
    assert compiled is not None, "not cached"
    sess = Session(model, compiled, handle, programs=cache)
    mark("session_load_ms")
    interp = litekiln.interpreter.Interpreter(model_path=a.model)
    x = interp.random_inputs(0)
    mark("(inputs)")
    sess.run(dict(zip(model.main.inputs, x, strict=True)))
    mark("first_run_ms")
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in marks.items()}))


if __name__ == "__main__":
    main()
