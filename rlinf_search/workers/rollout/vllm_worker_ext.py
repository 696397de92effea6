"""Methods vLLM mixes into its worker processes (``worker_extension_cls``), called by ``collective_rpc``.

Imported inside vLLM's workers, so it imports nothing of its own at module level.

A weight sync is one in-place reload spread over several calls: ``begin_hf_weights`` puts the model in vLLM's
layerwise reload mode, each ``load_hf_bucket`` loads one bucket through the model's own loader (which fuses
q/k/v and gate/up), and vLLM processes a layer (weight repacking on CPU) as soon as all its weights are in;
``finish_hf_weights`` processes what is left. So a worker holds one bucket and at most a layer's worth of the one
before, never the whole model.
"""

from __future__ import annotations


class WeightLoaderExtension:
    """Receives Hugging Face weights bucket by bucket and loads each into the worker's model in place."""

    def begin_hf_weights(self) -> None:
        """Start an in-place reload (vLLM's layerwise reload; ``reload_weights`` does the same in one call)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def load_hf_bucket(self, blob: bytes) -> int:
        """Load one bucket: a safetensors buffer of tensors named as in the Hugging Face model; returns how many."""
        from safetensors.torch import load
        from vllm.config import set_current_vllm_config

        weights = load(blob)
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(weights=iter(weights.items()))
        return len(weights)

    def finish_hf_weights(self) -> None:
        """Process the layers not processed yet and drop the state derived from the old weights."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        runner = self.model_runner
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(runner.get_model(), runner.model_config)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            getattr(runner, reset, lambda: None)()
