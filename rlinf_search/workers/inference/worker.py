"""A rank of the InferenceGroup: a copy of the policy and the frozen reference, forward passes only.

Disaggregated, the actor's devices only train: the log-probs of a batch under the policy that will
be updated (the "old" policy of PPO's ratio) and under the reference (the KL term) are computed
here, on devices of their own. The policy copy takes the actor's weights after every update through
the same weight sync as the rollout engine, so it always equals the actor's current weights.
"""

from __future__ import annotations

from rlinf_search.data.batch import RolloutBatch
from rlinf_search.scheduler import Worker
from rlinf_search.workers.actor.config import ActorConfig
from rlinf_search.workers.actor.hf_model import load_causal_lm
from rlinf_search.workers.actor.logprobs import ForwardLogprobs, score_rows
from rlinf_search.workers.actor.parallel import COMPUTE_DTYPES
from rlinf_search.workers.actor.token_scoring import TokenScorer, packs_rows
from rlinf_search.workers.inference.config import InferenceConfig
from rlinf_search.workers.weight_loading import load_weight_buckets


class InferenceWorker(Worker):
    """Scores its token-balanced share of a batch's rows (every rank gets the whole batch); receives the
    policy's weights from the actor. Each rank holds whole models and runs no collective."""

    def __init__(self, actor: ActorConfig, inference: InferenceConfig, *, policy: bool, reference: bool):
        """``actor``: the model and its forward settings; ``policy``/``reference``: which copies the driver
        will ask log-probs of (recomputed old log-probs; a KL term)."""
        self.actor, self.inference = actor, inference
        # Both start as the starting policy; on a resume the driver's first weight sync brings the
        # policy copy to the checkpoint's weights, while the reference stays the starting policy.
        self.policy = self._load() if policy else None
        self.reference = self._load() if reference else None
        self.weight_version = 0
        loaded = self.policy or self.reference
        self.packed = loaded is not None and packs_rows(loaded.lm, actor.pack_sequences)
        self.shares_prompts = actor.share_prompts and not self.packed

    def _load(self) -> TokenScorer:
        # Forward passes only: the compute precision is all it needs (no master weights).
        model = load_causal_lm(self.actor.model_path, dtype=COMPUTE_DTYPES[self.actor.dtype],
                               attn_implementation=self.actor.model_attention)
        scorer = TokenScorer(model.to(self.device).eval(), chunk_tokens=self.actor.logprob_chunk_tokens)
        scorer.requires_grad_(False)
        return scorer

    def compute_logprobs(self, batch: RolloutBatch, *, old: bool, ref: bool) -> ForwardLogprobs:
        """This rank's share: ``old``, log-probs under the actor's weights as last synced; ``ref``, under
        the reference."""
        actor = self.actor
        rows: list[int] = []
        for wanted, scorer, what in ((old, self.policy, "a policy copy"), (ref, self.reference, "a reference")):
            if wanted and scorer is None:
                raise RuntimeError(f"log-probs asked of an InferenceGroup launched without {what}")

        def score(scorer):
            nonlocal rows
            rows, logprobs = score_rows(scorer, batch, rank=self.rank, world_size=self.world_size,
                                        packed=self.packed, temperature=actor.loss.temperature,
                                        max_tokens=actor.max_tokens_per_mbs,
                                        rows_per_pass=self.inference.forward_micro_batch_size,
                                        device=self.device, share_prompts=self.shares_prompts)
            return logprobs

        old_logprobs = score(self.policy) if old else None
        ref_logprobs = score(self.reference) if ref else None
        return ForwardLogprobs(rows=rows, old=old_logprobs, ref=ref_logprobs)  # rows: set by score

    def set_weights(self, state_dict: dict, version: int) -> None:
        self.set_weight_buckets(iter([state_dict]), version)

    def set_weight_buckets(self, buckets, version: int) -> None:
        if self.policy is None:
            raise RuntimeError("this InferenceGroup holds no policy copy (algorithm.recompute_logprobs is false); "
                               "it should not be a weight-sync receiver")
        load_weight_buckets(self.policy.lm, buckets)  # copies each bucket in as it arrives
        self.weight_version = version
