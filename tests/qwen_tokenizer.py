"""A byte-level BPE with Qwen's added tokens at their real ids and a real Qwen chat template, built offline.

No model hub here: the tokenizer is trained on the HotpotQA text and the templates' own words (so merges such as
``>\\n`` + ``\\n`` happen as they do in Qwen's BPE), padded with unreachable filler entries up to id 151643, and
given Qwen2.5's added tokens at 151643-151664 (and Qwen3's <tool_response>, </tool_response>, <think>, </think>
at 151665-151668), each special or not as Qwen's ``tokenizer_config.json`` marks it. The chat templates are Qwen's
own (tests/data/chat_templates, sources in tests/data/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import DATA_DIR, HOTPOT_DIR

TEMPLATES = DATA_DIR / "chat_templates"
FIRST_ADDED_ID = 151643
# Qwen2.5's added tokens in id order, and whether each is special (skipped by decode(skip_special_tokens=True)).
QWEN25_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
                ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
                ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False)]
QWEN3_ADDED = QWEN25_ADDED + [("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
                              ("</think>", False)]


def build_qwen_tokenizer(out: Path, template: str):
    """A ``PreTrainedTokenizerFast`` saved to ``out`` and loaded back, with ``template`` (a file name in
    tests/data/chat_templates: ``qwen2.5-instruct.jinja``, ``qwen3.jinja``, ``qwen3-thinking-prompt.jinja``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    chat_template = (TEMPLATES / template).read_text()
    texts = [json.loads(line)["contents"] for line in (HOTPOT_DIR / "corpus.jsonl").read_text().splitlines()]
    # The templates' frames as they appear around tool turns, many times, so their merges are learned.
    texts += [chat_template, "<|im_start|>user\n<tool_response>\nDoc 1(Title: x) y\n</tool_response><|im_end|>\n"
              "<|im_start|>assistant\n<think>\nLet me see.\n</think>\n\n" * 20]
    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    base.decoder = decoders.ByteLevel()
    base.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    state = json.loads(base.to_str())
    vocab = state["model"]["vocab"]
    for filler in range(len(vocab), FIRST_ADDED_ID):  # never produced by a merge: placeholders up to Qwen's ids
        vocab[f"<|filler_{filler}|>"] = filler
    padded = Tokenizer.from_str(json.dumps(state))
    added = QWEN3_ADDED if "qwen3" in template else QWEN25_ADDED
    for token, special in added:
        if special:
            padded.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        else:
            padded.add_tokens([AddedToken(token, special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=padded, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    loaded = AutoTokenizer.from_pretrained(out)
    ids = {token: loaded.convert_tokens_to_ids(token) for token, _ in added}
    assert list(ids.values()) == list(range(FIRST_ADDED_ID, FIRST_ADDED_ID + len(added))), ids
    return loaded
