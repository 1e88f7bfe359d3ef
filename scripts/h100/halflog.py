"""Why a device's OpenCL compiler rejects a cached fp16 (half) program: print the build log.

    python scripts/h100/halflog.py CACHE_DIR MODEL...
"""

from __future__ import annotations

import sys

import pyopencl as cl

from litekiln.cache.models import ModelCache
from litekiln.model import load_model
from litekiln.runtime.artifact import CompileOptions


def main() -> None:
    cache = ModelCache.open(sys.argv[1])
    ctx = cl.create_some_context(interactive=False)
    for path in sys.argv[2:]:
        m = load_model(path)
        c = cache.load_model(m.token, CompileOptions(precision="fp16", schedules="fast"))
        if c is None:
            continue
        src = c.partitions[0].program.source
        print("==", m.name, "source lines", src.count("\n"))
        try:
            cl.Program(ctx, src).build(options=["-Dcl_khr_fp16=1"])
            print("built OK")
        except cl.Error as e:
            print(str(e)[:12000])
        print(src[:3000])
        return


if __name__ == "__main__":
    main()
