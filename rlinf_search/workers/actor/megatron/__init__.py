"""The Megatron training backend (``actor.training_backend: megatron``).

``weights`` and ``config`` are plain torch/Python (the checkpoint converter and ``validate_cfg`` use
them without megatron-core); ``model`` and ``trainer`` import megatron-core and are loaded only when
the backend is built. See docs/megatron.md.
"""
