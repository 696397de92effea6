"""Methods vLLM mixes into its worker processes (``worker_extension_cls``), called by ``collective_rpc``.

Imported inside vLLM's workers, so it imports nothing at module level (the methods import what they use).

A weight sync is one in-place reload spread over several calls: ``begin_hf_weights`` puts the model in vLLM's
layerwise reload mode, each ``load_hf_bucket`` loads one bucket file (``bucket_files``) through the model's own
loader (which fuses q/k/v and gate/up), and vLLM processes a layer (weight repacking on CPU) as soon as all its
weights are in; ``finish_hf_weights`` processes what is left. So a worker maps one bucket and keeps at most a
layer's worth of the one before, never the whole model.
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

    def load_hf_bucket(self, path: str, layout: list) -> int:
        """Load one bucket: a file of tensors named as in the Hugging Face model (``bucket_files``), read through
        a mapping of it; returns how many."""
        from vllm.config import set_current_vllm_config

        from rlinf_search.workers.rollout.bucket_files import read_bucket_file

        weights = read_bucket_file(path, layout)
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
