"""User code named by dotted path in a config, as a user's own package would hold it.

Each entry leaves a mark a test can read from the run's metrics: the reward is EM plus 0.25, the
KL estimate is 0.5 on every token, and the advantage is +1 on every model token (so the first
update's policy loss is -1: every sampled token is pushed up, with ratio 1).
"""

from __future__ import annotations

import torch

from rlinf_search.algorithms import AdvantageOutput, advantage_traits
from rlinf_search.rewards import compute_score
from rlinf_search.workers.rollout.scripted import ScriptedEngine

KL_CONSTANT = 0.5
REWARD_BONUS = 0.25


def always_plus_one(inputs) -> AdvantageOutput:
    """An advantage estimator: +1 on every model token."""
    advantages = inputs.response_mask.float()
    return AdvantageOutput(advantages=advantages, returns=advantages)


@advantage_traits(group_local=True, needs_group=True)
def reward_minus_group_mean(inputs) -> AdvantageOutput:
    """An estimator that declares its traits: each trajectory's reward minus its group's mean (group-local)."""
    from rlinf_search.algorithms.advantages import _broadcast, group_stats

    scores = inputs.sequence_rewards()
    mean, _, _ = group_stats(scores, inputs.require_uids())
    return _broadcast(scores - mean, inputs)


def em_plus_quarter(solution_str, golden_answers, **kwargs) -> float:
    """A reward: exact match, plus 0.25 for every answer."""
    return compute_score("em", solution_str, golden_answers) + REWARD_BONUS


def constant_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """A KL estimator: 0.5 on every token, whatever the log-probs."""
    return torch.full_like(logprob, KL_CONSTANT)


def no_aggregation(token_losses: torch.Tensor, mask: torch.Tensor, **kwargs) -> torch.Tensor:
    """A loss aggregation: the plain mean over model tokens of this call."""
    return (token_losses * mask).sum() / mask.sum().clamp(min=1)


def unit_weights(old_logprob, rollout_logprob, *, response_mask, cap, low):
    """A mismatch correction that changes nothing."""
    from rlinf_search.algorithms.importance import truncated_is_weights

    return truncated_is_weights(old_logprob, old_logprob, response_mask=response_mask, cap=cap)


def read_lines(path):
    """A data reader (yields nothing)."""
    return iter(())


def build_nothing(*args, **kwargs):
    """A rollout engine or search backend factory (never called by the contract test)."""
    raise NotImplementedError


def recording_hf_engine(config, *, device=None, seed=0):
    """The HF engine, keeping the sampling parameters of every request it is sent (``.requests``)."""
    from rlinf_search.workers.rollout.hf_engine import build_hf_engine

    engine = build_hf_engine(config, device=device, seed=seed)
    engine.requests = []
    generate = engine.generate

    async def recorded(prompt_ids, sampling):
        engine.requests.append(sampling)
        return await generate(prompt_ids, sampling)

    engine.generate = recorded
    return engine


NOT_CALLABLE = 3


def word_parity(solution_str, golden_answers, **kwargs) -> float:
    """A reward a random model earns half the time: 1 for an odd number of words (GRPO groups then disagree
    and the update moves the policy, which EM alone rarely makes a random model do)."""
    return float(len(solution_str.split()) % 2)


class NeedsGpuTrainer:
    """A trainer class named by dotted path that says what it needs (``actor.training_backend``)."""

    needs_cuda = True
    requires = ("no_such_mod",)
    install_hint = "pip install no-such-mod"


class ToolCallingEngine(ScriptedEngine):
    """A rollout engine that calls the search tool once with the prompt's question, then answers with the first
    retrieved title, each turn ended by the end token: the ``toolcall`` protocol through the whole runner
    without a model that has learnt to call. Stateless, so every sample of a group does the same (the scripted
    engine's weight, offload and close methods apply as they are)."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [])

    async def generate(self, prompt_ids, sampling):
        import json
        import re

        from rlinf_search.data.io_struct import GenerationOutput

        text = self.tokenizer.decode(prompt_ids)
        if "<tool_response>" not in text:
            user = text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]
            question = user.strip().splitlines()[-1].removeprefix("Question:").strip()
            turn = "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query_list": [question]}}) + "\n</tool_call>"
        else:
            title = re.search(r"Doc 1\(Title: ([^)]*)\)", text.rsplit("<tool_response>", 1)[-1])
            turn = f"<answer> {title.group(1) if title else 'unknown'} </answer>"
        ids = self.tokenizer.encode(turn, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        ids = ids[:sampling.max_new_tokens]
        finish = "eos" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return GenerationOutput(ids, [-0.5] * len(ids), finish, None)


def tool_calling_engine(config, *, device=None, seed=0):
    """``rollout.rollout_backend`` factory of ``ToolCallingEngine`` over the tokenizer at ``rollout.model.model_path``."""
    from transformers import AutoTokenizer

    return ToolCallingEngine(AutoTokenizer.from_pretrained(config.model_path))


def reinforce_loss(logprob, old_logprob, advantages, *, response_mask, **clip):
    """A policy loss: plain REINFORCE, -A log p per model token (no ratio, so no clipping to report)."""
    from rlinf_search.algorithms import PolicyLossOutput
    from rlinf_search.algorithms.aggregation import zero_outside

    zero = logprob.new_zeros(())
    return PolicyLossOutput(token_losses=zero_outside(-advantages.detach() * logprob, response_mask.bool()),
                            clip_fraction=zero, dual_clip_fraction=zero, approx_kl=zero, ratio_mean=zero + 1,
                            ratio_max=zero + 1)
