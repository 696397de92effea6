"""Methods vLLM mixes into its worker processes (``worker_extension_cls``), called by ``collective_rpc``.

Imported inside vLLM's workers, so it imports nothing of its own at module level.
"""

from __future__ import annotations


class WeightLoaderExtension:
    """Receives Hugging Face weights in buckets, then loads them all into the worker's model in place."""

    def receive_hf_weights(self, blob: bytes) -> int:
        """Keep one bucket: a safetensors buffer of tensors named as in the Hugging Face model."""
        from safetensors.torch import load

        pending = self.__dict__.setdefault("_rlinf_pending_weights", {})
        weights = load(blob)
        pending.update(weights)
        return len(weights)

    def apply_hf_weights(self) -> int:
        """Load every received tensor at once; returns how many.

        vLLM's in-place reload (``reload_weights``, vLLM >= 0.11 or so) expects the whole model in one
        pass: it re-runs the post-load processing (weight repacking on CPU, fused q/k/v and gate/up) per
        layer once the layer is complete. Older vLLM loads straight through the model's loader.
        """
        weights = self.__dict__.pop("_rlinf_pending_weights", {})
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=iter(weights.items()))
        else:
            self.model_runner.model.load_weights(weights=iter(weights.items()))
        return len(weights)
