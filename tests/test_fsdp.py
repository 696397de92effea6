"""The GPU recipe's training shapes on CPU: FSDP2 and DDP over 2 gloo ranks, bf16 compute over fp32 master
weights, mini-batches that split into different numbers of micro-batches on each rank, packed rows and
chunked log-probs. Every case here hung, silently learnt nothing, or was never run before."""

from __future__ import annotations

import pickle
import socket
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoTokenizer

from rlinf_search.algorithms import compute_advantages
from rlinf_search.data.batch import collate_trajectories, pack_rows_by_budget
from rlinf_search.data.io_struct import Trajectory
from rlinf_search.data.rank_plan import balance_by_tokens, plan_passes, split_into
from rlinf_search.workers.actor.config import ActorConfig, OptimConfig, PolicyLossConfig
from rlinf_search.workers.actor.logprobs import place_rows
from rlinf_search.workers.actor.policy_trainer import PolicyTrainer
from rlinf_search.workers.actor.token_scoring import TokenScorer, layout_batch
from tests.fsdp_ranks import offload_round_trip, train_steps

BUDGET = 60  # tokens per micro-batch: the batch below cuts into 3 micro-batches on one rank, 2 on the other


def _spawn(target, world_size: int, *args) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(target, args=(world_size, port, *args), nprocs=world_size, join=True)


def _uneven_batch(tokenizer, *, rows: int = 7):
    """Prompts and responses of many lengths, observations inside; GRPO advantages from mixed rewards."""
    trajs = []
    for i in range(rows):
        prompt = tokenizer.encode(f"Question {i}: who wrote book number {i}?" + " really" * (i % 3))
        turn = tokenizer.encode("<search> " + "word " * (1 + 3 * i % 7) + "</search>")
        obs = tokenizer.encode("\n\n<information>Doc 1(Title: x) " + "text " * (2 + i) + "</information>\n\n")
        final = tokenizer.encode("<answer> " + "name " * (1 + i % 4) + "</answer>")
        ids = turn + obs + final
        trajs.append(Trajectory(uid=f"q{i // 2}", prompt_ids=prompt, response_ids=ids,
                                response_mask=[1] * len(turn) + [0] * len(obs) + [1] * len(final),
                                rollout_logprobs=[0.0] * len(ids)))
    rewards = [float(i % 2) for i in range(rows)]
    batch = collate_trajectories(trajs, rewards, pad_id=tokenizer.pad_token_id)
    batch.advantages = compute_advantages("grpo", rewards=batch.rewards, response_mask=batch.response_mask,
                                          uids=batch.uids).advantages
    return batch


def _config(model_dir, **changes) -> ActorConfig:
    # adam_eps 1: Adam's first step is then about lr * g rather than lr * sign(g), so float noise in a
    # near-zero gradient cannot flip an update and the weights compare tightly (the update is the gradient).
    settings = dict(model_path=str(model_dir), max_tokens_per_mbs=BUDGET, n_minibatches=2,
                    optim=OptimConfig(lr=1.0, adam_eps=1.0, weight_decay=0.0, clip_grad=0.5, total_steps=10),
                    loss=PolicyLossConfig(kl_beta=0.0), shuffle_rollout=False)
    settings.update(changes)
    return ActorConfig(**settings)


def one_process_and_two_ranks(config: ActorConfig, batch, tmp_path, **single_changes) -> tuple[dict, dict, list[dict]]:
    """One PPO update of ``batch`` in one process (``ddp`` at one rank, ``single_changes`` applied to its config),
    then ``train_steps`` on 2 spawned ranks under ``config``: (the process's metrics, its weights, each rank's
    results)."""
    single = PolicyTrainer(replace(config, training_backend="ddp", **single_changes))
    batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [single.compute_logprobs(batch)])
    expected = single.train_on_batch(batch)
    expected_weights = single.rollout_state_dict()
    (tmp_path / "config.pkl").write_bytes(pickle.dumps(config))
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(replace(batch, old_logprobs=None)))
    _spawn(train_steps, 2, str(tmp_path))
    return expected, expected_weights, [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]


def test_the_batch_splits_unevenly_across_ranks(tiny_model_dir):
    """The premise of the 2-rank tests: without padding passes the ranks would run different counts."""
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    tokens = batch.token_counts().tolist()
    uneven = 0
    for minibatch in split_into(list(range(len(batch))), 2):
        shares = balance_by_tokens(minibatch, tokens, 2)
        raw = [len(pack_rows_by_budget(share, tokens, BUDGET)) for share in shares]
        uneven += raw[0] != raw[1]
        planned = [plan_passes(batch, minibatch, rank=r, world_size=2, max_tokens=BUDGET) for r in range(2)]
        assert len(planned[0].passes) == len(planned[1].passes) == max(raw) >= 2
        assert sorted(planned[0].rows + planned[1].rows) == minibatch
    assert uneven, "some mini-batch cuts into different numbers of micro-batches on the two ranks"
    assert split_into(list(range(5)), 4) == [[0, 1], [2], [3], [4]] and split_into([0], 3) == [[0], [], []]


@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_two_ranks_match_one_process_on_uneven_micro_batches(backend, tiny_model_dir, tmp_path):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    config = _config(tiny_model_dir, training_backend=backend)
    expected, expected_weights, ranks = one_process_and_two_ranks(config, batch, tmp_path)
    assert sorted(ranks[0]["rows"] + ranks[1]["rows"]) == list(range(len(batch))), "each row scored once"
    assert ranks[1]["weights"] == {}, "rank 0 alone holds the gathered weights"
    for name, tensor in ranks[0]["weights"].items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-5, rtol=0, msg=name)
    # A weight sync to bf16 receivers gathers each tensor cast on the device: the fp32 gather, rounded once.
    sync = ranks[0]["sync_weights"]
    assert sync.keys() == ranks[0]["weights"].keys() and ranks[1]["sync_weights"] == {}
    for name, tensor in ranks[0]["weights"].items():
        assert sync[name].dtype == torch.bfloat16 and torch.equal(sync[name], tensor.to(torch.bfloat16)), name
    if backend == "fsdp":  # the tied LM head is the embedding: gathered once, one tensor under both names
        assert sync["lm_head.weight"] is sync["model.embed_tokens.weight"]
    grad_norms = [r["metrics"]["actor/grad_norm"] for r in ranks]
    assert grad_norms[0] == pytest.approx(grad_norms[1]) == pytest.approx(expected["actor/grad_norm"], rel=1e-4)
    assert expected["actor/grad_norm"] > 0.5, "the clip was active on both sides"
    losses = sum(r["metrics"]["actor/pg_loss"] for r in ranks) / 2
    assert losses == pytest.approx(expected["actor/pg_loss"], rel=1e-4, abs=1e-6)
    # The checkpoint round trip under the backend: the resumed trainer's next update is the original's.
    (first_metrics, first_weights), (resumed_metrics, resumed_weights) = ranks[0]["next"], ranks[0]["resumed"]
    assert first_metrics == resumed_metrics
    assert all(torch.equal(first_weights[n], resumed_weights[n]) for n in first_weights)


def test_fsdp_shards_fp32_master_weights_and_optimizer_state(tiny_model_dir, tmp_path):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    config = _config(tiny_model_dir, training_backend="fsdp", dtype="bfloat16")
    (tmp_path / "config.pkl").write_bytes(pickle.dumps(config))
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(batch))
    _spawn(train_steps, 2, str(tmp_path))
    rank0 = pickle.loads((tmp_path / "rank0.pkl").read_bytes())
    full = {n: t.shape for n, t in rank0["weights"].items()}
    embed = rank0["local_params"]["lm.model.embed_tokens.weight"]
    assert embed[0] == "torch.float32" and embed[1][0] * 2 == full["model.embed_tokens.weight"][0], "half a shard"
    assert {dtype for dtype, _ in rank0["local_params"].values()} == {"torch.float32"}
    assert rank0["optim_dtypes"] == {"torch.float32"}
    assert all(t.dtype == torch.float32 for t in rank0["weights"].values())


def test_bf16_compute_learns_at_rl_learning_rates(tiny_model_dir):
    """bf16 weights under AdamW at lr 1e-6 barely move (the update is below bf16's rounding step); bf16
    compute over fp32 master weights moves them as fp32 training does."""
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    moved = {}
    for dtype in ("float32", "bfloat16"):
        config = _config(tiny_model_dir, dtype=dtype, training_backend="ddp",
                         optim=OptimConfig(lr=1e-6, weight_decay=0.0, total_steps=100))
        trainer = PolicyTrainer(config)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        batch.old_logprobs = place_rows(tuple(batch.response_mask.shape), [trainer.compute_logprobs(batch)])
        for _ in range(5):
            trainer.train_on_batch(batch)
        changed = sum(int((p.detach() != before[n]).sum()) for n, p in trainer.model.named_parameters())
        moved[dtype] = changed / sum(p.numel() for p in before.values())
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert moved["float32"] > 0.9 and moved["bfloat16"] > 0.9, moved
    # The failure this guards against, shown on the same model: bf16 parameters under a plain AdamW.
    model = PolicyTrainer(_config(tiny_model_dir, training_backend="ddp")).model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(5):
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        optimizer.step()
    stuck = sum(int((p.detach() != before[n]).sum()) for n, p in model.named_parameters())
    assert stuck / sum(p.numel() for p in before.values()) < 0.2


def test_packed_and_padded_logprobs_agree(tiny_model_dir):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer = PolicyTrainer(_config(tiny_model_dir, training_backend="ddp", max_tokens_per_mbs=None))
    with torch.no_grad():
        results = {}
        for packed in (True, False):
            layout = layout_batch(batch, packed=packed)
            flat, entropy, _ = trainer.scorer(layout)
            results[packed] = (layout.to_rows(flat), layout.to_rows(entropy))
    assert layout_batch(batch, packed=True).input_ids.shape[1] == int(batch.attention_mask.sum()), "no padding"
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=0)


def test_chunked_logprobs_and_gradients_match_whole_logits(tiny_model_dir):
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    trainer = PolicyTrainer(_config(tiny_model_dir, training_backend="ddp"))
    layout = layout_batch(batch, packed=True)
    grads = {}
    for chunk in (7, 100_000):
        scorer = TokenScorer(trainer.model, chunk_tokens=chunk)
        trainer.model.zero_grad()
        logprobs, entropy, _ = scorer(layout, entropy_grad=True)
        (logprobs.sum() + 0.1 * entropy.sum()).backward()
        grads[chunk] = (logprobs.detach(), entropy.detach(),
                        {n: p.grad.clone() for n, p in trainer.model.named_parameters()})
    torch.testing.assert_close(grads[7][0], grads[100_000][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[7][1], grads[100_000][1], atol=1e-5, rtol=0)
    for name, grad in grads[7][2].items():
        # fp32 sums over many tokens in another order: round-off scales with the gradient's size (the tied
        # embedding's reaches ~1e2), not with each element's.
        whole = grads[100_000][2][name]
        torch.testing.assert_close(grad, whole, atol=1e-5 + 1e-6 * float(whole.abs().max()), rtol=1e-4)
    # No entropy gradient when its coefficient is 0: the entropy comes back detached.
    entropy = TokenScorer(trainer.model)(layout, entropy_grad=False).entropy
    assert not entropy.requires_grad


@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_offload_round_trip_leaves_training_unchanged(backend, tiny_model_dir, tmp_path):
    """``actor.offload_*`` under the data-parallel backends: weights, gradients and Adam moments give their
    memory back between updates (FSDP2's shard buffers included: the old ``param.data`` swap left them in
    place), and the next two updates are those of a trainer never offloaded."""
    batch = _uneven_batch(AutoTokenizer.from_pretrained(tiny_model_dir))
    config = _config(tiny_model_dir, training_backend=backend, dtype="bfloat16")
    (tmp_path / "config.pkl").write_bytes(pickle.dumps(config))
    (tmp_path / "batch.pkl").write_bytes(pickle.dumps(replace(batch, old_logprobs=None)))
    _spawn(offload_round_trip, 2, str(tmp_path))
    for rank in range(2):
        result = pickle.loads((tmp_path / f"rank{rank}.pkl").read_bytes())
        (plain_metrics, plain_weights), (off_metrics, off_weights) = result["plain"], result["offloaded"]
        assert result["left_bytes"] == {"weights": 0, "grads": 0, "optimizer": 0}, (rank, result["left_bytes"])
        assert min(result["counted"].values()) > 0, result["counted"]
        assert off_metrics == plain_metrics, rank
        assert all(torch.equal(plain_weights[n], off_weights[n]) for n in plain_weights)
