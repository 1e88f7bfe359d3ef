"""Where a warm start's time goes inside litekiln: cProfile of Interpreter() + first run.

    python scripts/remote_gpu/profile_warm.py MODEL --cache-dir D [--top 30]

Run it on a warm cache (after a start that stored the device binaries). Prints the wall
time and the functions with the largest cumulative time (litekiln and pyopencl calls), so
that the parts of `open` and `load` in `litekiln bench --startup` can be told apart.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import litekiln.interpreter


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    interp = litekiln.interpreter.Interpreter(model_path=a.model, cache_dir=a.cache_dir)
    interp.allocate_tensors()
    prof.disable()
    inputs = interp.random_inputs(0)
    prof.enable()
    interp.run(inputs)
    prof.disable()
    print(f"== {a.model}: warm start {1e3 * (time.perf_counter() - t0):.1f} ms (inputs included)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
