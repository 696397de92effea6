"""The chaos run (issue 54): 20 ``async`` steps through real Ray workers (2 rollout ranks, 2 FSDP actor ranks training
the tiny Qwen2, a SearchTool rank, two real retrieval replicas on loopback) with a fault at fixed steps:

- after step 3: rollout rank 1's process ends mid-turn (``os._exit``, as a crash would);
- after step 7: the SearchTool rank is SIGKILLed;
- after step 11: retrieval replica A is SIGKILLed;
- after step 15: replica B, the only one left, is paused (SIGSTOP) for 5 s.

The run must finish, every step training its full batch or recording what it dropped and why, no infrastructure error
reaching a reward, no prompt trained twice. The engine is scripted (``tests.test_rank_restarts:dying_engine``: every
trajectory searches, then answers): the faults under test are in the runtime, the tool and the servers, which a
random tiny model that seldom searches would not reach.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from rlinf_search.data.prepare import load_records
from rlinf_search.data.prompt_stream import PromptStream
from rlinf_search.retrieval.launch import RetrievalServerProcess
from tests.test_infra_run import ENV, _main, _trained_finish_reasons, _watch_steps
from tests.test_rank_restarts import KILL_FILE_ENV
from tests.test_stream_step import _rank_pid
from tests.test_train_runner import ROOT, _config, _metrics, synth  # noqa: F401 - fixtures

STEPS, BATCH, GROUP = 20, 4, 2
PAUSE_S = 5.0


@pytest.mark.heavy  # about 40 s on 2 cores
def test_twenty_async_steps_survive_a_fault_every_four_steps(tmp_path, synth, tiny_model_dir):  # noqa: F811
    args = ["--index-dir", str(synth / "index"), "--corpus", str(synth / "corpus.jsonl"), "--retriever", "bm25"]
    replica_a = RetrievalServerProcess(args).start()
    replica_b = RetrievalServerProcess(args).start()
    kill_file = tmp_path / "kill"
    cfg = _config(tmp_path, synth, replica_a, tiny_model_dir, **{
        "runner.pipeline": "async", "runner.max_steps": STEPS, "runner.save_interval": 5,
        "runner.val_check_interval": 0, "runner.rollout_dump": BATCH * GROUP, "algorithm.n_minibatches": 2,
        "rollout.rollout_backend": "tests.test_rank_restarts:dying_engine",
        "cluster.cpu_slots_per_node": 2, "cluster.max_restarts": 3,
        "tools.search.num_workers": 1, "tools.search.server_addr": [replica_a.address, replica_b.address],
        "tools.search.backoff_base_s": 0.05, "tools.search.backoff_max_s": 0.2,
        "agentloop.infra_reruns": 4, "agentloop.infra_rerun_wait_s": 1.0})
    cfg.cluster.component_placement = {"actor,rollout,reward": "all"}
    env = {**ENV, KILL_FILE_ENV: str(kill_file), "RLINF_TEST_KILL_ONCE": "1"}
    process = subprocess.Popen(_main(cfg, tmp_path), cwd=ROOT, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log_lines: list[str] = []
    reader = threading.Thread(target=lambda: log_lines.extend(process.stdout), daemon=True)  # no full pipe
    reader.start()
    faults_at: dict[str, float] = {}

    def fault(name: str, act):
        def run():
            faults_at[name] = time.monotonic()
            act()
        return run

    resume_b = threading.Timer(PAUSE_S, lambda: _continue(replica_b))

    def pause_b():
        os.kill(replica_b.process.pid, signal.SIGSTOP)
        resume_b.start()

    faults = {3: fault("rollout rank", kill_file.touch),
              7: fault("tool rank", lambda: os.kill(_rank_pid(session=process.pid, title="ray::SearchToolWorker"),
                                                    signal.SIGKILL)),
              11: fault("replica A", replica_a.kill),
              15: fault("replica B paused", pause_b)}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_steps, args=(tmp_path / "run", faults, stop))
    watcher.start()
    try:
        returncode = process.wait(timeout=900)
    finally:
        stop.set()
        watcher.join()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        reader.join(timeout=10)
        resume_b.cancel()
        _continue(replica_b)  # never left paused, whatever failed
        replica_a.stop()
        replica_b.stop()
    log = "".join(log_lines)
    assert returncode == 0, log[-3000:]
    assert sorted(faults_at) == ["replica A", "replica B paused", "rollout rank", "tool rank"], "every fault landed"
    assert not kill_file.exists(), "rollout rank 1 died once"

    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "the run finished"
    assert rows[-1]["runtime/restarts"] == 1 and rows[-1]["runtime/tool_restarts"] == 1
    # Every step trained its full batch, or recorded the groups it dropped (and why, in the audit).
    audit = [json.loads(line) for line in (tmp_path / "run" / "logs" / "batches.jsonl").read_text().splitlines()]
    assert [row["step"] for row in audit] == list(range(1, STEPS + 1))
    for row, metrics in zip(audit, rows):
        dropped = row.get("dropped_infra", [])
        assert len(row["uids"]) + len(dropped) == BATCH, row
        assert len(row["responses"]) == len(row["uids"]) * GROUP
        assert metrics["rollout/groups_dropped_infra"] == len(dropped)
    # No infrastructure error reached a reward: no trained trajectory ended on one, and none read one as a result.
    assert "infra_error" not in _trained_finish_reasons(tmp_path / "run")
    trained_text = "".join(path.read_text() for path in (tmp_path / "run" / "rollouts").glob("step_*.jsonl"))
    for sign in ("search tool rank", "unreachable", "timed out", "failed:"):
        assert sign not in trained_text, sign
    # No prompt trained twice, none skipped: each step trained (or dropped) exactly the prompts a sync run takes.
    stream = PromptStream(load_records(synth / "train.prepared.jsonl"), BATCH, shuffle=True, seed=0)
    for row in audit:
        expected = [record.uid for record in stream.next_batch()]
        assert sorted(row["uids"] + row.get("dropped_infra", [])) == sorted(expected), row["step"]


def _continue(server: RetrievalServerProcess) -> None:
    try:
        os.kill(server.process.pid, signal.SIGCONT)
    except ProcessLookupError:  # already stopped
        pass
