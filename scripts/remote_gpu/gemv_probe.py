"""How fast can a decode step's matrix-vector products run on this GPU through OpenCL?

A language model's decode step is its matrix-vector products (one token: ``y = W x`` for
every projection) and little else: each reads its weights once, so it is bound by memory,
and the H200 profiles of the thirty-third session (results/h200/session33-int32/) put
litekiln's (dlight's GEMV schedule on the weights TFLite's FULLY_CONNECTED gives, laid out
``[K, N]`` by the emitter) at 194-504 GB/s of the GPU's 4 TB/s. This script times
hand-written OpenCL kernels of the same products, over the two weight layouts and a few
thread shapes each, to find what a schedule must do to reach the bandwidth, before one is
written as a TIR rule:

* ``nk``: weights ``[N, K]`` (TFLite's own layout: a row per output, contiguous terms):
  ``lanes`` work-items per row read ``float4`` steps of it, ``rows`` rows per work-group,
  the lanes' partial sums added in local memory.
* ``kn``: weights ``[K, N]`` (litekiln's layout today): a work-item per ``cols`` outputs
  (``float`` or ``float4`` of adjacent columns), ``slices`` work-items per column splitting
  K, their partial sums added in local memory.

Each kernel is checked against numpy (float64) and timed with OpenCL profiling events
(median of ``--reps`` launches, device time only): GB/s = the weights' and vector's bytes /
time. Shapes: Gemma 3 270M's projections (width 640, 1024 query, 256 key/value, 2048 MLP).

    python scripts/remote_gpu/gemv_probe.py [--reps 200] [--json OUT]

A benchmark: never run by pytest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

SHAPES = [(2048, 640), (640, 2048), (1024, 640), (256, 640), (640, 1024)]  # (N, K)

NK = """
__kernel void gemv_nk(__global const float4* w, __global const float4* x, __global float* y,
                      int n, int k4) {
  __local float part[ROWS * LANES];
  int lane = get_local_id(0), r = get_local_id(1);
  int row = get_group_id(0) * ROWS + r;
  float acc = 0.0f;
  if (row < n) {
    __global const float4* wr = w + (long)row * k4;
    #pragma unroll 4
    for (int i = lane; i < k4; i += LANES) {
      float4 a = wr[i], b = x[i];
      acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }
  }
  part[r * LANES + lane] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = LANES / 2; s > 0; s >>= 1) {
    if (lane < s) part[r * LANES + lane] += part[r * LANES + lane + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lane == 0 && row < n) y[row] = part[r * LANES];
}
"""

KN = """
__kernel void gemv_kn(__global const VT* w, __global const float* x, __global VT* y,
                      int nv, int k) {
  __local VT part[SLICES * COLS];
  int c = get_local_id(0), s = get_local_id(1);
  int col = get_group_id(0) * COLS + c;
  VT acc = (VT)(0.0f);
  if (col < nv) {
    int per = (k + SLICES - 1) / SLICES, k0 = s * per, k1 = min(k, k0 + per);
    #pragma unroll 8
    for (int i = k0; i < k1; ++i) acc += w[(long)i * nv + col] * x[i];
  }
  part[s * COLS + c] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = SLICES / 2; h > 0; h >>= 1) {
    if (s < h) part[s * COLS + c] += part[(s + h) * COLS + c];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (s == 0 && col < nv) y[col] = part[c];
}
"""


def _variants() -> list[tuple[str, str, dict[str, int]]]:
    out = []
    for lanes, rows in [(8, 32), (16, 16), (32, 8), (32, 4), (64, 4), (64, 2), (128, 2)]:
        out.append(("nk", f"nk lanes={lanes} rows={rows}", {"LANES": lanes, "ROWS": rows}))
    for vec in (1, 4):
        for cols, slices in [(32, 8), (16, 16), (32, 16), (64, 4), (8, 32), (32, 32)]:
            out.append(
                ("kn", f"kn float{vec} cols={cols} slices={slices}",
                 {"COLS": cols, "SLICES": slices, "VEC": vec})
            )  # fmt: skip
    return out


def main() -> int:
    import pyopencl as cl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json")
    ap.add_argument("--any", action="store_true", help="any OpenCL device (a test on PoCL)")
    a = ap.parse_args()
    kind = cl.device_type.ALL if a.any else cl.device_type.GPU
    devices = [d for p in cl.get_platforms() for d in p.get_devices(kind)]
    if not devices:
        print("no OpenCL GPU", file=sys.stderr)
        return 1
    dev = devices[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    mf = cl.mem_flags
    rng = np.random.default_rng(0)
    results = {"device": dev.name, "reps": a.reps, "rows": []}
    print(f"{dev.name}: median device time of {a.reps} launches")
    for n, k in SHAPES:
        w_nk = rng.standard_normal((n, k)).astype(np.float32)
        x = rng.standard_normal(k).astype(np.float32)
        want = w_nk.astype(np.float64) @ x.astype(np.float64)
        w_kn = np.ascontiguousarray(w_nk.T)
        nbytes = w_nk.nbytes + x.nbytes + n * 4
        bufs = {
            "nk": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=w_nk),
            "kn": cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=w_kn),
        }
        xb = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        yb = cl.Buffer(ctx, mf.WRITE_ONLY, n * 4)
        for layout, name, d in _variants():
            if layout == "nk":
                if k % 4:
                    continue
                src = NK.replace("LANES", str(d["LANES"])).replace("ROWS", str(d["ROWS"]))
                kern = cl.Program(ctx, src).build().gemv_nk
                args = (bufs["nk"], xb, yb, np.int32(n), np.int32(k // 4))
                gsize = ((n + d["ROWS"] - 1) // d["ROWS"] * d["LANES"], d["ROWS"])
                lsize = (d["LANES"], d["ROWS"])
            else:
                vec = d["VEC"]
                if n % vec:
                    continue
                vt = "float" if vec == 1 else f"float{vec}"
                src = (
                    KN.replace("VT", vt)
                    .replace("COLS", str(d["COLS"]))
                    .replace("SLICES", str(d["SLICES"]))
                )
                kern = cl.Program(ctx, src).build().gemv_kn
                nv = n // vec
                args = (bufs["kn"], xb, yb, np.int32(nv), np.int32(k))
                gsize = ((nv + d["COLS"] - 1) // d["COLS"] * d["COLS"], d["SLICES"])
                lsize = (d["COLS"], d["SLICES"])
            kern.set_args(*args)
            for _ in range(5):
                cl.enqueue_nd_range_kernel(q, kern, gsize, lsize)
            q.finish()
            got = np.empty(n, np.float32)
            cl.enqueue_copy(q, got, yb)
            err = float(np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want))))
            times = []
            for _ in range(a.reps):
                ev = cl.enqueue_nd_range_kernel(q, kern, gsize, lsize)
                ev.wait()
                times.append((ev.profile.end - ev.profile.start) * 1e-9)
            t = statistics.median(times)
            row = {
                "n": n, "k": k, "kernel": name, "us": round(t * 1e6, 2),
                "gbps": round(nbytes / t / 1e9, 1), "groups": gsize[0] // lsize[0],
                "rel_err": err,
            }  # fmt: skip
            results["rows"].append(row)
            flag = "" if err < 1e-4 else "  WRONG"
            print(
                f"N={n:5d} K={k:5d} {name:34s} {row['us']:7.2f} us {row['gbps']:7.1f} GB/s "
                f"{row['groups']:5d} groups{flag}",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
