"""``rlinf-search view``: its API over a real run's files, and the page in a real headless Chromium (Debian's
``chromium`` and ``chromium-driver``; the test is skipped, saying why, where they are not installed:
``scripts/test.sh`` installs them where it can)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A real 3-step run with rollout dumps (4 a step, and the validation's) and a monitor that fired."""
    from rlinf_search.retrieval.build_index import main as build_index_main
    from toolkits.synth_task import SynthSpec, write_task

    out = tmp_path_factory.mktemp("viewed")
    paths = write_task(out / "data", SynthSpec(people=80, seed=3))
    for split in ("train", "val"):
        done = subprocess.run([sys.executable, "-m", "rlinf_search.data.prepare", "--input", str(paths[split]),
                               "--format", "flashrag", "--data-source", "synth", "--template", "brief", "--out",
                               str(out / "data" / f"{split}.prepared.jsonl")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert build_index_main(["--corpus", str(paths["corpus"]), "--out", str(out / "index"), "--retriever", "bm25"]) == 0
    run = out / "run"
    done = subprocess.run([
        sys.executable, "-m", "rlinf_search.cli", "train", "tiny-cpu", f"runner.output_dir={run}", "runner.max_steps=3",
        "runner.save_interval=3", "runner.val_check_interval=3", "runner.rollout_dump=4", "runner.resume_dir=null",
        "runner.logger.logger_backends=[jsonl]", f"rollout.model.model_path={tiny_model_dir}",
        f"data.train_data_paths=[{out / 'data' / 'train.prepared.jsonl'}]",
        f"data.val_data_paths=[{out / 'data' / 'val.prepared.jsonl'}]", "data.rollout_batch_size=4",
        "algorithm.group_size=2", "algorithm.sampling_params.max_new_tokens=24", "tools.search.backend=inprocess",
        f"tools.search.index_dir={out / 'index'}", f"tools.search.corpus={out / 'data' / 'corpus.jsonl'}"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def viewer(run_dir, tmp_path_factory):
    address_file = tmp_path_factory.mktemp("viewer") / "address"
    process = subprocess.Popen([sys.executable, "-m", "rlinf_search.cli", "view", str(run_dir), "--port", "0",
                                "--save-address-to", str(address_file)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not address_file.is_file():
            assert process.poll() is None and time.monotonic() < deadline, "the viewer did not start"
            time.sleep(0.2)
        yield f"http://{address_file.read_text().strip()}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.heavy
def test_the_api_serves_the_runs_dumps_metrics_and_firings(viewer, run_dir):
    run = _get(f"{viewer}/api/run")
    assert [(d["name"], d["kind"]) for d in run["dumps"]] == [("step_1", "train"), ("step_2", "train"),
                                                                ("step_3", "train"), ("val_step_3", "val")]
    assert any(f["monitor"] == "format" for f in run["firings"]), "the random model never answers: format fires"
    rows = _get(f"{viewer}/api/rollouts/step_2")["rows"]
    assert len(rows) == 4 and all(isinstance(r["advantage"], float) for r in rows)
    for row in rows:  # every span lists its tokens, and they make up its text (a piece of a UTF-8 character
        for span in row["response"]:  # decodes alone to U+FFFD, so only whole-character texts compare)
            assert span["tokens"], span
            if "\ufffd" not in span["text"]:
                assert "".join(span["tokens"]) == span["text"], span
    followed = _get(f"{viewer}/api/prompt/{rows[0]['uid']}")["rows"]
    assert all(r["uid"] == rows[0]["uid"] for r in followed) and {r["dump"] for r in followed} >= {"step_2"}
    with pytest.raises(urllib.error.HTTPError) as missing:
        _get(f"{viewer}/api/rollouts/step_99")
    assert missing.value.code == 404 and "no rollout file step_99" in json.loads(missing.value.read())["error"]
    assert _get(f"{viewer}/api/run")["dumps"], "the server keeps serving after a 404"


@pytest.mark.heavy
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium and chromedriver on PATH (Debian: apt-get "
                    "install chromium chromium-driver; scripts/test.sh does it where it runs as root)")
def test_the_page_in_a_real_browser_lists_filters_and_shows_trained_and_masked_tokens(viewer, run_dir, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    wait = WebDriverWait(driver, 30)
    try:
        driver.get(viewer)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#list tbody tr"))
        listed = driver.find_element(By.ID, "listed").text
        assert listed == "4 of 4 trajectories"
        # A filter changes what is listed: the trajectories of one finish reason only, then none with reward > 0.
        rows = _get(f"{viewer}/api/rollouts/step_1")["rows"]
        reasons = sorted({r["finish_reason"] for r in rows})
        Select(driver.find_element(By.ID, "filter-finish")).select_by_value(reasons[0])
        expected = sum(r["finish_reason"] == reasons[0] for r in rows)
        wait.until(lambda d: d.find_element(By.ID, "listed").text == f"{expected} of 4 trajectories")
        Select(driver.find_element(By.ID, "filter-finish")).select_by_value("any")
        Select(driver.find_element(By.ID, "filter-reward")).select_by_value("positive")
        positive = sum(r["reward"] > 0 for r in rows)
        wait.until(lambda d: d.find_element(By.ID, "listed").text == f"{positive} of 4 trajectories")
        Select(driver.find_element(By.ID, "filter-reward")).select_by_value("any")
        # A trajectory with an observation renders its turns, trained and masked tokens told apart.
        mixed = next(r for r in rows if {s["kind"] for s in r["response"]} - {"model"})
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#list tbody tr[data-index='{mixed['index']}']"))
        driver.find_element(By.CSS_SELECTOR, f"#list tbody tr[data-index='{mixed['index']}']").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#turns .turn"))
        trained = driver.find_elements(By.CSS_SELECTOR, "#turns .turn.model .tok.trained")
        masked = driver.find_elements(By.CSS_SELECTOR, "#turns .turn:not(.model) .tok.masked")
        model_tokens = sum(len(s["tokens"]) for s in mixed["response"] if s["kind"] == "model")
        assert len(trained) == model_tokens and masked, (len(trained), model_tokens, len(masked))
        assert trained[0].value_of_css_property("background-color") != masked[0].value_of_css_property(
            "background-color")
        # The monitor filter narrows the steps to those of the collapse; the curves mark the firing.
        Select(driver.find_element(By.ID, "filter-monitor")).select_by_value("format")
        driver.find_element(By.ID, "tab-curves").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.chart line.fired"))
        driver.save_screenshot(str(tmp_path / "viewer.png"))
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
