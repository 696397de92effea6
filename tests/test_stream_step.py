"""The streamed step (``runner.pipeline: stream``) through real worker groups on CPU: 2 rollout ranks with
uneven shares put finished groups on a real channel, 2 reward ranks score them, a 2-rank actor trains each
mini-batch as it fills; every trajectory is trained on exactly once, and a killed rollout rank stops the run
in one line, which then resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlinf_search.config import ConfigError, validate_cfg
from tests.test_train_runner import ROOT, _batches, _command, _config, _metrics, _run, server, synth  # noqa: F401 (fixtures)

BATCH, GROUP, MINIBATCHES = 5, 2, 5  # rollout shares 3 and 2; a mini-batch is one group


def _stream_config(where: Path, synth, server, tiny_model_dir, **changes):  # noqa: F811
    cfg = _config(where, synth, server, tiny_model_dir, **{
        "runner.pipeline": "stream", "algorithm.recompute_logprobs": False, "data.rollout_batch_size": BATCH,
        "algorithm.group_size": GROUP, "algorithm.n_minibatches": MINIBATCHES, "runner.max_steps": 2,
        "runner.val_check_interval": 0, **changes})
    cfg.cluster.cpu_slots_per_node = 2  # actor, rollout and reward: 2 ranks each
    return cfg


def _minibatches(run_dir: Path) -> dict[int, list[list[int]]]:
    rows = [json.loads(line) for line in (run_dir / "logs" / "minibatches.jsonl").read_text().splitlines()]
    return {row["step"]: row["minibatches"] for row in rows}  # a resumed step's row replaces the killed one's


def test_every_group_is_trained_once_as_it_arrives(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    # A reward the random model earns about half the time, so groups disagree and every update moves it.
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir,
                         **{"reward.score": "tests.registry_plugins.word_parity"})
    run = validate_cfg(cfg)
    assert run.runner.pipeline.name == "stream" and run.placement["rollout"].world_size == 2
    result = _run(cfg, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["actor/kl"] > 0, "step 1's mini-batch updates moved the policy away from the reference"
    for row in rows:
        assert row["actor/grad_norm"] > 0 and 0 < row["reward/mean"] < 1
        assert row["stream/minibatches"] == MINIBATCHES and row["rollout/trajectories"] == BATCH * GROUP
        # The first optimizer step is handed to the actor while later groups are still being generated.
        assert row["stream/first_update_s"] < row["stream/last_group_s"]
        for key in ("actor/grad_norm", "actor/kl", "reward/mean", "time/stream_s", "time/weight_sync_s"):
            assert key in row, key
    minibatches = _minibatches(tmp_path / "run")
    batches = _batches(tmp_path / "run")
    for step in (1, 2):
        trained = [g for mb in minibatches[step] for g in mb]
        assert sorted(trained) == list(range(BATCH)), f"step {step}: every group once, none twice: {trained}"
        assert len(batches[step]["responses"]) == BATCH * GROUP


@pytest.mark.parametrize("changes, message", [
    ({"algorithm.recompute_logprobs": True}, "old log-probs that stay put"),
    ({"algorithm.adv_type": "reinforce_plus_plus"}, "group-local estimator"),
    ({"algorithm.adv_type": "tests.registry_plugins.always_plus_one"}, r"group-local estimator \(grpo, grpo_no_std, "
                                                                      r"rloo, or yours declared"),
    ({"algorithm.ppo_epochs": 2}, "ppo_epochs must be 1"),
    ({"algorithm.n_minibatches": 2}, "must divide into algorithm.n_minibatches"),
    ({"runner.pipeline": "overlap"}, "placement mode disaggregated"),
    ({"runner.pipeline": "streaming"}, "unknown 'streaming'"),
])
def test_a_pipeline_the_run_cannot_have_is_refused_at_start_up(tmp_path, synth, server, tiny_model_dir, changes,  # noqa: F811
                                                                  message):
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **changes)
    with pytest.raises(ConfigError, match=message) as caught:
        validate_cfg(cfg)
    assert "\n" not in str(caught.value)


def test_a_users_estimator_declares_its_traits_where_it_lives(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    """A dotted-path estimator's ``@advantage_traits`` are read at start-up: group-local, it may stream; needing
    groups, a group of one is refused (the built-ins' traits are registered with them the same way)."""
    estimator = "tests.registry_plugins.reward_minus_group_mean"
    run = validate_cfg(_stream_config(tmp_path, synth, server, tiny_model_dir, **{"algorithm.adv_type": estimator}))
    assert run.runner.pipeline.name == "stream" and run.adv_type == estimator
    with pytest.raises(ConfigError, match=f"algorithm.group_size must be >= 2 for {estimator}"):
        validate_cfg(_stream_config(tmp_path, synth, server, tiny_model_dir,
                                    **{"algorithm.adv_type": estimator, "algorithm.group_size": 1,
                                       "algorithm.n_minibatches": 1}))


def test_the_agent_loop_group_size_is_read_and_a_negative_one_refused(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    assert validate_cfg(_stream_config(tmp_path, synth, server, tiny_model_dir)).agent_loop_workers == 0
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{"agentloop.num_workers": 2})
    assert validate_cfg(cfg).agent_loop_workers == 2
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{"agentloop.num_workers": -1})
    with pytest.raises(ConfigError, match="agentloop.num_workers") as caught:
        validate_cfg(cfg)
    assert "\n" not in str(caught.value)


def test_the_placement_decides_when_pipeline_is_unset(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    cfg = _config(tmp_path, synth, server, tiny_model_dir)
    assert validate_cfg(cfg).runner.pipeline.name == "sync"
    cfg.cluster.cpu_slots_per_node = 3
    cfg.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "2"}
    assert validate_cfg(cfg).runner.pipeline.name == "overlap"


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, synth, server, tiny_model_dir) -> Path:  # noqa: F811
    """Three sync steps with inline rollout ranks: what the streamed runs below are held against."""
    where = tmp_path_factory.mktemp("sync")
    sync = _stream_config(where, synth, server, tiny_model_dir, **{"runner.pipeline": "sync", "runner.max_steps": 3})
    result = _run(sync, where)
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "run"


# A streamed run killed and resumed, about two minutes each on 2 cores (and the sync run once), in the heavy lane.
@pytest.mark.heavy
@pytest.mark.parametrize("agent_loop_workers, victim, group", [
    (0, "ray::RolloutWorker", "RolloutGroup"), (2, "ray::AgentLoopWorker", "AgentLoopGroup")],
    ids=["rollout-rank", "agent-loop-rank"])
def test_stream_samples_what_sync_samples_and_survives_a_killed_rollout_rank(tmp_path, synth, server,  # noqa: F811
                                                                            tiny_model_dir, sync_run,
                                                                            agent_loop_workers, victim, group):
    """Step 1 of a streamed run samples the very tokens a sync run samples (same weights, same seeds: only
    the order of training differs), also when an AgentLoop group sends the turns to engine servers. The rank
    that runs agent loops (a rollout rank, or an agent-loop rank) killed mid-step stops the run with one line
    naming it; the same command resumes from the last checkpoint, and every step is trained once."""
    # cluster.max_restarts 0: a lost rank stops the run (tests/test_rank_restarts.py has it started again).
    cut = _stream_config(tmp_path / "cut", synth, server, tiny_model_dir, **{
        "runner.max_steps": 3, "runner.resume_dir": "auto", "agentloop.num_workers": agent_loop_workers,
        "cluster.max_restarts": 0})
    process, stderr = _kill_after_checkpoint_1(cut, tmp_path / "cut", victim, timeout=300)  # mid step 2
    assert process.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert f"RunStopped: {group} rank" in last and "stream_rollout()" in last and "in step 2" in last, last
    assert [r["step"] for r in _metrics(tmp_path / "cut" / "run")] == [1], "step 2 never logged half-trained"

    result = _run(cut, tmp_path / "cut")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in _metrics(tmp_path / "cut" / "run")] == [1, 2, 3]
    cut_batches, sync_batches = _batches(tmp_path / "cut" / "run"), _batches(sync_run)
    assert cut_batches[1] == sync_batches[1], "step 1 streamed samples the very tokens step 1 in sync samples"
    for step in (2, 3):
        assert cut_batches[step]["uids"] == sync_batches[step]["uids"], f"step {step}: the same prompts"
        assert sorted(g for mb in _minibatches(tmp_path / "cut" / "run")[step] for g in mb) == list(range(BATCH))


@pytest.mark.heavy
def test_a_sync_run_through_engine_servers_samples_what_inline_rollout_ranks_sample(tmp_path, synth, server,  # noqa: F811
                                                                                   tiny_model_dir, sync_run):
    """Three sync steps with the agent loops in an AgentLoop group and the engines as servers behind its
    routers (weights synced to the servers, engines stepping aside for the collocated actor): every step
    samples the very tokens the inline rollout ranks sampled."""
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.pipeline": "sync", "runner.max_steps": 3, "agentloop.num_workers": 2})
    result = _run(cfg, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = _batches(tmp_path / "run"), _batches(sync_run)
    assert [got[step] for step in (1, 2, 3)] == [expected[step] for step in (1, 2, 3)]


@pytest.mark.heavy
def test_a_killed_agent_loop_rank_is_started_again_and_the_step_trains_every_group(tmp_path, synth, server,  # noqa: F811
                                                                                   tiny_model_dir):
    """An AgentLoop rank (the engines are servers behind its routers) SIGKILLed mid-step: it is started again, handed
    the engine servers and the SearchTool group, and its groups that never arrived roll out again; every step trains
    its 5 groups once and the restart is counted."""
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 3, "agentloop.num_workers": 2, "tools.search.num_workers": 1})
    process, stderr = _kill_after_checkpoint_1(cfg, tmp_path, "ray::AgentLoopWorker", timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["runtime/restarts"] == 0 and rows[-1]["runtime/restarts"] == 1
    assert "AgentLoopGroup rank" in stderr and "starting it again" in stderr
    for step, minibatches in _minibatches(tmp_path / "run").items():
        assert sorted(g for mb in minibatches for g in mb) == list(range(BATCH)), f"step {step}: every group once"


@pytest.mark.heavy
def test_a_killed_search_tool_rank_is_started_again_and_the_run_trains_every_group(tmp_path, synth, server,  # noqa: F811
                                                                                   tiny_model_dir):
    """The SearchTool group's only rank killed mid-step: Ray starts it again behind the handle the agent loops
    hold; the searches in flight at its death fail as infrastructure errors, so their groups roll out again once
    it answers (never trained on the error); every step trains its full batch, and the restart is counted."""
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 3, "agentloop.num_workers": 2, "tools.search.num_workers": 1,
        "agentloop.infra_rerun_wait_s": 1})
    process, stderr = _kill_after_checkpoint_1(cfg, tmp_path, "ray::SearchToolWorker", timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    rows = _metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["runtime/tool_restarts"] == 0 and rows[-1]["runtime/tool_restarts"] == 1
    assert all(r.get("rollout/groups_dropped_infra", 0) == 0 for r in rows)
    for step, minibatches in _minibatches(tmp_path / "run").items():
        assert sorted(g for mb in minibatches for g in mb) == list(range(BATCH)), f"step {step}: every group once"
    audit = [json.loads(line) for line in (tmp_path / "run" / "logs" / "batches.jsonl").read_text().splitlines()]
    assert all(len(row["responses"]) == BATCH * GROUP for row in audit)


@pytest.mark.heavy
def test_a_killed_search_tool_rank_stops_a_streamed_run_in_one_line(tmp_path, synth, server, tiny_model_dir):  # noqa: F811
    """With ``cluster.max_restarts: 0`` the SearchTool group's only rank killed mid-step is not started again: the
    run stops at the step's search metrics with one line naming the rank (the groups whose searches failed are
    never trained); the same command resumes and trains every step."""
    cfg = _stream_config(tmp_path, synth, server, tiny_model_dir, **{
        "runner.max_steps": 3, "runner.resume_dir": "auto", "agentloop.num_workers": 2,
        "tools.search.num_workers": 1, "cluster.max_restarts": 0})
    process, stderr = _kill_after_checkpoint_1(cfg, tmp_path, "ray::SearchToolWorker", timeout=300)
    assert process.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert "SearchToolGroup rank 0" in last, last
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1]
    result = _run(cfg, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in _metrics(tmp_path / "run")] == [1, 2, 3]
    assert sorted(g for mb in _minibatches(tmp_path / "run")[3] for g in mb) == list(range(BATCH))


def _kill_after_checkpoint_1(cfg, where: Path, victim: str, *, timeout: float) -> tuple[subprocess.Popen, str]:
    """Train ``cfg`` in a child process (its run under ``where / "run"``), SIGKILL the rank whose process title starts
    with ``victim`` once the step-1 checkpoint is complete (mid step 2), and wait for the run to end; the process and
    its stderr."""
    process = subprocess.Popen(_command(cfg, where), cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(where / "run", 1, process)
    os.kill(_rank_pid(session=process.pid, title=victim), signal.SIGKILL)
    _, stderr = process.communicate(timeout=timeout)
    return process, stderr


def _wait_for_checkpoint(run_dir: Path, step: int, process: subprocess.Popen) -> None:
    mark = run_dir / "checkpoints" / f"global_step_{step}" / "COMPLETE"
    deadline = time.monotonic() + 600
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not mark.exists():
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate(timeout=60)
        raise AssertionError(f"the run should reach its step-{step} checkpoint; it ended with:\n{stderr[-3000:]}")


def _rank_pid(session: int, title: str) -> int:
    """The pid of a rank whose process title starts with ``title`` (Ray titles actor processes
    ``ray::<Class>...``) in the run whose driver leads ``session`` (Ray's processes stay in the driver's
    session), read from /proc (no procps needed). Other runs on the machine are left be."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except OSError:  # the process ended meanwhile
                continue
            if cmdline.startswith(title) and int(fields[3]) == session:
                return int(proc.name)
        time.sleep(0.1)
    raise AssertionError(f"no {title} process found")


def test_a_streamed_steps_teacher_metrics_add_counts_and_average_the_rest():
    from rlinf_search.distill.scorer import TeacherScorer

    merged = TeacherScorer.merge_metrics([
        {"distill/reverse_kl": 0.2, "distill/failed_trajectories": 1.0, "distill/unaligned_tokens": 3.0},
        {"distill/reverse_kl": 0.4, "distill/failed_trajectories": 2.0, "distill/unaligned_tokens": 0.0}])
    assert merged == pytest.approx({"distill/reverse_kl": 0.3, "distill/failed_trajectories": 3.0,
                                    "distill/unaligned_tokens": 3.0})
