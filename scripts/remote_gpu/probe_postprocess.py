"""Time SSD's TFLite_Detection_PostProcess (litekiln's numpy op) and its parts on this host,
on inputs shaped like ssd_mobilenet's (1917 anchors, 91 classes), random like the bench's.

    python scripts/remote_gpu/probe_postprocess.py [MODEL.tflite]
"""

from __future__ import annotations

import json
import sys
import timeit

import numpy as np


def main() -> None:
    from litekiln.ops import detection as d

    rng = np.random.default_rng(0)
    n, c = 1917, 91
    enc = rng.standard_normal((1, n, 4)).astype(np.float32)
    cls = (1 / (1 + np.exp(-rng.standard_normal((1, n, c))))).astype(np.float32)
    anchors = np.stack(
        [
            rng.uniform(0, 1, n),
            rng.uniform(0, 1, n),
            rng.uniform(0.05, 0.5, n),
            rng.uniform(0.05, 0.5, n),
        ],
        1,
    ).astype(np.float32)
    scores = cls[0, :, 1:]
    boxes = d.decode_boxes(enc[0], anchors, (10.0, 10.0, 5.0, 5.0))
    best = scores.max(axis=1)

    def t(fn, number=200):
        return round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 1)

    out = {
        "numpy": np.__version__,
        "decode_boxes_us": t(lambda: d.decode_boxes(enc[0], anchors, (10.0, 10.0, 5.0, 5.0))),
        "argmax_strided_us": t(lambda: scores.argmax(axis=1)),
        "max_strided_us": t(lambda: scores.max(axis=1)),
        "argsort_1917_us": t(lambda: np.argsort(-best, kind="stable")),
        "nms_us": t(lambda: d.nms_single_class(boxes, best, 10, 1e-8, 0.6)),
        "small_op_us": t(lambda: np.add(best[:4], 1.0), number=20000),
    }
    if len(sys.argv) > 1:
        from litekiln.interpreter import Interpreter
        from litekiln.reference import run_ops

        it = Interpreter(model_path=sys.argv[1], device="reference")
        it.allocate_tensors()
        vals = it.run(it.random_inputs(0), intermediates=True)
        g = it.model.main
        op = next(o for o in g.ops if o.custom_code == "TFLite_Detection_PostProcess")
        ins = {k: vals[k] for k in op.inputs if k in vals}
        out["op_on_model_inputs_us"] = t(lambda: run_ops([op], g, dict(ins)), number=50)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
