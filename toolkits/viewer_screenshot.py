"""A PNG of ``rlinf-search view`` on a run, for the docs: the viewer started on loopback, the page opened in headless
Chromium (Debian's ``chromium`` and ``chromium-driver``), a trajectory that searched opened.

    python -m toolkits.viewer_screenshot RUN_DIR --out docs/img/viewer.png [--dump step_30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dump", default=None, help="the rollout file to show (default: the last training step's)")
    args = parser.parse_args(argv)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    address = Path(tempfile.mkdtemp()) / "address"
    server = subprocess.Popen([sys.executable, "-m", "rlinf_search.cli", "view", args.run_dir, "--port", "0",
                               "--save-address-to", str(address)])
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1100"):
        options.add_argument(flag)
    driver = None
    try:
        while not address.is_file():
            time.sleep(0.2)
        url = f"http://{address.read_text().strip()}"
        with urllib.request.urlopen(f"{url}/api/run") as response:
            dumps = [d["name"] for d in json.loads(response.read())["dumps"] if d["kind"] == "train"]
        dump = args.dump or dumps[-1]
        with urllib.request.urlopen(f"{url}/api/rollouts/{dump}") as response:
            rows = json.loads(response.read())["rows"]
        shown = next((r for r in rows if r["searches"] and r["reward"] > 0), rows[0])
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        wait = WebDriverWait(driver, 30)
        driver.get(url)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#list tbody tr"))
        Select(driver.find_element(By.ID, "dump")).select_by_value(dump)
        row = f"#list tbody tr[data-index='{shown['index']}']"
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
        time.sleep(0.5)
        driver.find_element(By.CSS_SELECTOR, row).click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#turns .turn"))
        driver.save_screenshot(args.out)
        print(f"wrote {args.out} ({dump}, trajectory {shown['index']})")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
