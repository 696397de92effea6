"""Dense encoders on the real MiniLM weights: pooling, prefixes, normalisation, batch-order invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlinf_search.retrieval.encoders import ENCODER_SPECS, DenseEncoder, EncoderSpec, encoder_spec, register_encoder


@pytest.fixture(scope="module")
def minilm() -> DenseEncoder:
    return DenseEncoder("minilm", query_precision="fp32")  # exact comparisons below


def test_family_specs_follow_their_papers():
    e5, bge = encoder_spec("e5"), encoder_spec("bge")
    assert (e5.query_prefix, e5.passage_prefix, e5.pooling, e5.max_length) == ("query: ", "passage: ", "mean", 256)
    assert bge.pooling == "cls" and bge.query_prefix.startswith("Represent this sentence") and bge.passage_prefix == ""
    with pytest.raises(ValueError, match="unknown dense encoder 'nope'"):
        encoder_spec("nope")


def test_outputs_are_unit_vectors_in_input_order(minilm):
    texts = ["a short one", "a considerably longer sentence about the history of Akkadian demons and spirits",
             "mid length text here"]
    together = minilm.encode_queries(texts, batch_size=2)
    alone = np.stack([minilm.encode_queries([t])[0] for t in texts])
    assert together.shape == (3, 384) and together.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    # Length-sorted batching must hand each text back its own vector.
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert minilm.encode_queries([]).shape == (0, 384)


def test_matching_passage_scores_highest(minilm):
    passages = ['"Lilu (mythology)"\nA lilu is a masculine Akkadian word for a spirit, related to Alu, demon.',
                '"Christopher Nolan"\nChristopher Nolan is an English-American film director and producer.',
                '"Haymo of Faversham"\nHaymo of Faversham was an English Franciscan scholar.']
    queries = ["Who directed Inception?", "Akkadian spirit", "Franciscan scholar from England"]
    scores = minilm.encode_queries(queries) @ minilm.encode_passages(passages).T
    assert scores.argmax(axis=1).tolist() == [1, 0, 2]


def test_prefixes_and_pooling_change_the_vectors(minilm):
    # The e5 and bge families on the MiniLM weights (their own weights need a hub): same text, other recipe.
    e5_like = DenseEncoder("e5", minilm.model_path)
    bge_like = DenseEncoder("bge", minilm.model_path)
    plain = minilm.encode_queries(["spirit"])[0]
    prefixed = minilm.encode_queries(["query: spirit"])[0]
    np.testing.assert_allclose(e5_like.encode_queries(["spirit"])[0], prefixed, atol=1e-5)
    np.testing.assert_allclose(e5_like.encode_passages(["spirit"])[0], minilm.encode_passages(["passage: spirit"])[0],
                               atol=1e-5)
    batch = minilm.tokenizer([bge_like.spec.query_prefix + "spirit"], return_tensors="pt")
    with torch.inference_mode():
        cls = minilm._model(**batch).last_hidden_state[0, 0]
    np.testing.assert_allclose(bge_like.encode_queries(["spirit"])[0], torch.nn.functional.normalize(cls, dim=0),
                               atol=1e-5)
    assert not np.allclose(plain, prefixed, atol=1e-3)


def test_bf16_query_batches_stay_close_to_fp32(minilm):
    bf16 = DenseEncoder("minilm", query_precision="bf16")
    queries = ["Who directed Inception?", "Akkadian spirit related to a demon", "Franciscan scholar", "Lilu"]
    batched = bf16.encode_queries(queries)
    exact = minilm.encode_queries(queries)
    cosine = (batched * exact).sum(axis=1)
    assert batched.dtype == np.float32 and np.all(cosine > 0.999), cosine
    np.testing.assert_allclose(bf16.encode_queries(["Lilu"]), minilm.encode_queries(["Lilu"]), atol=1e-6)
    with pytest.raises(ValueError, match="query precision must be auto, fp32 or bf16"):
        DenseEncoder("minilm", query_precision="fp16")


def test_register_encoder_and_missing_model_message(tmp_path, minilm):
    register_encoder("minilm-cls", lambda: EncoderSpec(str(minilm.model_path), "cls", "", "", 128))
    try:
        assert DenseEncoder("minilm-cls").encode_queries(["x"]).shape == (1, 384)
    finally:
        ENCODER_SPECS.unregister("minilm-cls")
    with pytest.raises(OSError, match="Pass --model with a local model directory"):
        DenseEncoder("minilm", str(tmp_path / "no-model-here"))
