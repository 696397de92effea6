"""An OpenAI-compatible completions server over a Hugging Face model (``python -m rlinf_search.serve``)."""
