"""Why a device's OpenCL compiler rejects a cached fp16 (half) program: the distinct errors.

    python scripts/remote_gpu/halflog.py CACHE_DIR MODEL...

Builds every partition of each model's fp16 (native half) compilation exactly as the
executor would (`DeviceProfile.driver_program`: the same prelude and options) and
prints, per model, "built OK" or each distinct error message with its count and one example.
"""

from __future__ import annotations

import collections
import re
import sys

import pyopencl as cl

from litekiln.artifact.compiled import CompileOptions
from litekiln.cache.models import ModelCache
from litekiln.model import load_model
from litekiln.runtime.profile import DeviceProfile


def main() -> None:
    cache = ModelCache.open(sys.argv[1])
    ctx = cl.create_some_context(interactive=False)
    dev = ctx.devices[0]
    profile = DeviceProfile.of(dev, ctx)
    for path in sys.argv[2:]:
        m = load_model(path)
        c = cache.load_model(m.token, CompileOptions(precision="fp16", schedules="fast"))
        if c is None:
            print("==", m.name, "not in the cache (fp16, native)")
            continue
        for part in c.partitions:
            driver = profile.driver_program(part.program.source, part.program.build_options)
            try:
                cl.Program(ctx, driver.source).build(options=list(driver.options), devices=[dev])
                print("==", m.name, "partition", part.index, "built OK")
            except cl.Error as e:
                text = str(e)
                errors = re.findall(r"error: (.*)", text)
                counts = collections.Counter(re.sub(r"'[^']*'", "'X'", x) for x in errors)
                print("==", m.name, "partition", part.index, f"FAILED: {len(errors)} errors")
                for msg, n in counts.most_common(12):
                    example = next(x for x in errors if re.sub(r"'[^']*'", "'X'", x) == msg)
                    print(f"  {n:6d}x {example[:200]}")


if __name__ == "__main__":
    main()
