"""Screenshot of a model's placement view (`litekiln.view`) in headless Chromium.

    .venv/bin/python scripts/view_screenshot.py models/zoo/face_detection_full_range_sparse.tflite \
        docs/images/view.png --op 377

Renders the view with the placement an app gets (options as for `litekiln inspect`), opens it
in Debian's ``chromium`` through ``chromium-driver`` and selenium (the ``view`` extra), selects
``--op`` (scrolled to the middle of the graph pane, its details in the side panel) and writes
the PNG. Fails if the page logs anything to the browser console.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.wait import WebDriverWait

from litekiln.model import load_model
from litekiln.placement import placement
from litekiln.view import write_view


def open_browser(width: int, height: int) -> webdriver.Chrome:
    """Headless Chromium (the system's) driven by selenium, console logged."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument(f"--window-size={width},{height}")
    opts.add_argument("--force-device-scale-factor=1")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts
    )
    # The window size includes the browser's frame: set the page's own size.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("--op", type=int, help="op to select and centre")
    ap.add_argument("--profile", help="JSON of `litekiln bench --profile --out`")
    ap.add_argument("--op-table", help="placement option op_table")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    a = ap.parse_args(argv)

    model = load_model(a.model)
    kw = {"op_table": a.op_table} if a.op_table else {}
    info, _ = placement(model, **kw)
    with tempfile.TemporaryDirectory() as tmp:
        page = write_view(model, info, Path(tmp) / "view.html", profile=a.profile)
        browser = open_browser(a.width, a.height)
        try:
            url = page.resolve().as_uri() + (f"#op-{a.op}" if a.op is not None else "")
            browser.get(url)
            WebDriverWait(browser, 20).until(
                lambda b: b.find_element("tag name", "body").get_attribute("data-ready") == "1"
            )
            errors = [e for e in browser.get_log("browser") if e["level"] != "INFO"]
            if errors:
                print(f"console: {errors}", file=sys.stderr)
                return 1
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(a.out))
        finally:
            browser.quit()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
