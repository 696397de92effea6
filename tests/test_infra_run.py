"""A training run meets a broken set-up or a dying service as a user's run would: a real retrieval server on
loopback, the tiny Qwen2, real Ray workers. The checks before any worker starts refuse each bad input in one line;
a server that dies mid-run trains no step on its errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlinf_search.config import validate_cfg
from rlinf_search.retrieval.launch import RetrievalServerProcess
from rlinf_search.runners.preflight import PreflightFailed, check_before_start
from rlinf_search.workers.rollout.scripted import ScriptedEngine
from tests.test_train_runner import ROOT, _command, _config, _metrics, server, synth  # noqa: F401 - fixtures

MAIN = ROOT / "examples/searchr1/main_searchr1.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # the entry script's folder is on its path; the engine below is in tests/


class SearchThenAnswer(ScriptedEngine):
    """Every trajectory searches, then answers once a search result is in its context (a random tiny model seldom
    writes a search). Stateless, so a group rolled out again writes the same turns."""

    def _turn_index(self, prompt_ids: list[int]) -> int:
        return int("Doc 1(Title:" in self.tokenizer.decode(prompt_ids))  # a search result, not the instructions


def searching_engine(config, *, device=None, seed=0):
    """``rollout.rollout_backend: tests.test_infra_run:searching_engine``."""
    from transformers import AutoTokenizer

    return SearchThenAnswer(AutoTokenizer.from_pretrained(config.model_path),
                            ["<search> a person </search>", "<answer> a city </answer>"])


def _main(cfg, tmp_path: Path) -> list[str]:
    """The user's command: the entry script on the config file ``_command`` writes to ``tmp_path``."""
    _command(cfg, tmp_path)
    return [sys.executable, str(MAIN), "--config-path", str(tmp_path), "--config-name", "config"]


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _copy_model(tiny_model_dir: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(tiny_model_dir, folder)
    return folder


def test_each_bad_start_up_input_is_refused_in_one_line_before_any_worker(tmp_path, synth, server, tiny_model_dir):
    def refusal(**changes) -> str:
        config = validate_cfg(_config(tmp_path, synth, server, tiny_model_dir, **changes))
        with pytest.raises(PreflightFailed) as caught:
            check_before_start(config)
        message = str(caught.value)
        assert "\n" not in message and "Traceback" not in message
        return message

    check_before_start(validate_cfg(_config(tmp_path, synth, server, tiny_model_dir)))  # the sound config passes

    closed = _closed_port()
    assert refusal(**{"tools.search.server_addr": closed}).startswith(
        f"tools.search.server_addr: the retrieval server at {closed} does not answer (GET http://{closed}/health: "
        "ConnectError); start it")
    # Every replica is asked, not just the first.
    assert f"the retrieval server at {closed}" in refusal(**{"tools.search.server_addr": [server.address, closed]})

    weights_file = tiny_model_dir / "model.safetensors"
    assert refusal(**{"rollout.model.model_path": str(weights_file)}).startswith(
        f"rollout.model.model_path: {weights_file} is a file; give the model's folder")
    assert "no model folder at" in refusal(**{"rollout.model.model_path": str(tmp_path / "nowhere")})

    truncated = _copy_model(tiny_model_dir, tmp_path, "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    message = refusal(**{"rollout.model.model_path": str(truncated)})
    assert message.startswith(f"rollout.model.model_path: cannot read {truncated / 'model.safetensors'}")
    assert "truncated" in message

    no_template = _copy_model(tiny_model_dir, tmp_path, "no_template")
    (no_template / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer_config = json.loads((no_template / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert "has no chat template, and the prompts are chat messages" in refusal(
        **{"rollout.model.model_path": str(no_template)})

    not_a_checkpoint = tmp_path / "some_folder"
    not_a_checkpoint.mkdir()
    assert refusal(**{"runner.resume_dir": str(not_a_checkpoint)}).startswith(
        f"runner.resume_dir: {not_a_checkpoint} is not a complete checkpoint")
    assert refusal(**{"runner.resume_dir": str(tmp_path / "absent")}).startswith("runner.resume_dir: no checkpoint")

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert refusal(**{"runner.output_dir": str(a_file / "run")}).startswith(
        f"runner.output_dir: cannot write to {a_file / 'run'}")


def test_a_run_against_a_closed_port_stops_before_any_worker_starts(tmp_path, synth, server, tiny_model_dir):
    """The command a user runs: one line on stderr, exit 2, no step, no checkpoint."""
    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{"tools.search.server_addr": _closed_port()})
    started = time.monotonic()
    result = subprocess.run(_main(cfg, tmp_path), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("cannot start: tools.search.server_addr: the retrieval server at "), last
    assert "Traceback" not in result.stderr and "ray" not in result.stderr.lower(), result.stderr[-2000:]
    assert not (tmp_path / "run" / "logs" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - started < 120


def _watch_steps(run_dir: Path, on_step: dict, stop: threading.Event) -> None:
    """Call ``on_step[k]()`` once step k is in the run's metrics (polling the file the run appends to)."""
    done: set[int] = set()
    path = run_dir / "logs" / "metrics.jsonl"
    while not stop.is_set() and len(done) < len(on_step):
        if path.is_file():
            for line in path.read_text().splitlines():
                step = json.loads(line)["step"]
                if step in on_step and step not in done:
                    done.add(step)
                    on_step[step]()
        time.sleep(0.2)


def _trained_finish_reasons(run_dir: Path) -> list[str]:
    return [json.loads(line)["finish_reason"] for path in sorted((run_dir / "rollouts").glob("step_*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.mark.heavy  # two runs of 4 steps and a resume: about 100 s on 2 cores
@pytest.mark.parametrize("back_after_s", [1.0, None], ids=["back-during-re-runs", "back-after-the-stop"])
def test_a_server_dying_mid_run_trains_no_step_on_its_errors(tmp_path, synth, tiny_model_dir, back_after_s):
    """Killed once step 1 of 4 is logged (so the failure lands in step 2, or in step 3 when step 2's fast scripted
    rollout was already done). Back a second later: that step's groups are rolled out again once it answers and the
    run trains all 4 steps on clean rollouts. Back only after the run stopped: that step stops the run in one line
    with no update made on the failure, and a resume from the last checkpoint finishes the run."""
    args = ["--index-dir", str(synth / "index"), "--corpus", str(synth / "corpus.jsonl"), "--retriever", "bm25"]
    server = RetrievalServerProcess(args).start()
    port = server.address.rpartition(":")[2]
    revived: list[RetrievalServerProcess] = []

    def revive():
        revived.append(RetrievalServerProcess([*args, "--port", port]).start())

    def kill_then_maybe_revive():
        server.kill()
        if back_after_s is not None:
            threading.Timer(back_after_s, revive).start()

    cfg = _config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 4, "runner.val_check_interval": 0, "runner.rollout_dump": 8,
        "rollout.rollout_backend": "tests.test_infra_run:searching_engine",
        # Back during the re-runs: 2 + 4 + 8 + 16 s of waits leave a loaded machine time to start the server.
        "agentloop.infra_reruns": 3 if back_after_s is None else 4, "agentloop.infra_rerun_wait_s": 2.0,
        "tools.search.backoff_base_s": 0.05, "tools.search.backoff_max_s": 0.2})
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_steps, args=(tmp_path / "run", {1: kill_then_maybe_revive}, stop))
    watcher.start()
    try:
        result = subprocess.run(_main(cfg, tmp_path), capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV)
        stop.set()
        watcher.join()
        if back_after_s is None:
            assert result.returncode == 1, result.stderr[-3000:]
            last = result.stderr.strip().splitlines()[-1]
            # The kill lands in step 2, or in step 3 when step 2's rollout was already done when step 1 was logged.
            stopped = re.match(r"stopped: step (\d): 4 of 4 GRPO groups met an infrastructure failure after 3 "
                               r"re-runs each", last)
            assert stopped and stopped.group(1) in "23", last
            assert f"search backend unreachable at {server.address}" in last, last
            assert [r["step"] for r in _metrics(tmp_path / "run")] == list(range(1, int(stopped.group(1))))
            revive()
            cfg.runner.resume_dir = "auto"
            result = subprocess.run(_main(cfg, tmp_path), capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV)
        assert result.returncode == 0, result.stderr[-3000:]
    finally:
        stop.set()
        server.stop()
        for back in revived:
            back.stop()
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/groups_dropped_infra"] == 0 for r in rows)
    assert all(r.get("rollout/finish_infra_error", 0) == 0 for r in rows)
    if back_after_s is not None:  # the step the kill landed in (2, or 3: see above) re-ran its groups
        assert sum(r["rollout/groups_rerun_infra"] for r in rows[1:3]) >= 1, rows
    assert "infra_error" not in _trained_finish_reasons(tmp_path / "run")
    audit = [json.loads(line) for line in (tmp_path / "run" / "logs" / "batches.jsonl").read_text().splitlines()]
    assert all(len(row["uids"]) == 4 and "dropped_infra" not in row for row in audit)
