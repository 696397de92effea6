"""A rank of the InferenceGroup: a copy of the policy and the frozen reference, forward passes only.

Disaggregated, the actor's devices only train: the log-probs of a batch under the policy that will
be updated (the "old" policy of PPO's ratio) and under the reference (the KL term) are computed
here, on devices of their own. The policy copy takes the actor's weights after every update through
the same weight sync as the rollout engine, so it always equals the actor's current weights.
"""

from __future__ import annotations

import torch

from rlinf_search.config import RunConfig
from rlinf_search.data.batch import RolloutBatch
from rlinf_search.scheduler import Worker
from rlinf_search.workers.actor.logprobs import ForwardLogprobs, batched_response_logprobs, forward_groups


class InferenceWorker(Worker):
    """Scores its share of a batch's rows; receives the policy's weights from the actor."""

    def __init__(self, config: RunConfig):
        self.config = config
        # Both start as the starting policy; on a resume the driver's first weight sync brings the
        # policy copy to the checkpoint's weights, while the reference stays the starting policy.
        self.policy = self._load() if config.recompute_logprobs else None
        self.reference = self._load() if config.actor.loss.kl_beta > 0 else None
        self.weight_version = 0

    def _load(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.config.actor.dtype]
        model = AutoModelForCausalLM.from_pretrained(self.config.actor.model_path, dtype=dtype)
        model = model.to(self.device).eval()
        model.requires_grad_(False)
        return model

    def compute_logprobs(self, batch: RolloutBatch) -> ForwardLogprobs:
        """Old-policy (the actor's weights as last synced) and reference log-probs of ``batch``'s rows."""
        groups = forward_groups(batch, rows_per_pass=self.config.inference.forward_micro_batch_size,
                                max_tokens=self.config.actor.max_tokens_per_mbs)
        temperature = self.config.actor.loss.temperature

        def score(model):
            return batched_response_logprobs(model, batch, groups, temperature=temperature) if model is not None else None

        return ForwardLogprobs(old=score(self.policy), ref=score(self.reference))

    def set_weights(self, state_dict: dict, version: int) -> None:
        if self.policy is None:
            raise RuntimeError("this InferenceGroup holds no policy copy (algorithm.recompute_logprobs is false); "
                               "it should not be a weight-sync receiver")
        # Tensors from shared memory are read-only views: load_state_dict copies them into the model.
        self.policy.load_state_dict({name: torch.as_tensor(value) for name, value in state_dict.items()})
        self.weight_version = version
