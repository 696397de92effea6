"""Can a model copy the answer out of the passages in front of it? Each question gets the scripted good search
(the subject, then the bridge entity), run through the real agent loop and search server; the model is then
scored teacher-forced on the answer turn: a question counts as copied when every answer token is the model's
most likely next token. This separates reading (copying a fact in context) from searching (finding it).
The same scripted trajectory also scores the first query: the tokens of the first model turn after its first
one (the search tag: whether to search is a separate decision), that is the subject's name and the closing tag.

    python -m toolkits.answer_copy_probe --data outputs/demo/data/test.prepared.jsonl \\
        --server-addr 127.0.0.1:8000 --model outputs/distill/student outputs/demo/rl/checkpoints/global_step_30/hf_model

Prints one line per model: copied / questions where the gold answer is in the retrieved passages; the first
query copied (every token the argmax) / questions, and the query tokens' mean summed log-prob (the teacher-forced
log-likelihood of writing the subject as the query, which moves long before the argmax does).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import torch

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.data.prepare import load_records
from toolkits.sft_scripts import BehaviourMix, SyntheticScripts
from toolkits.sft_warmstart import _collect_from_server
from toolkits.warmstart_probes import gold_in_passages, score_trajectories


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="prepared synthetic jsonl (the test split)")
    parser.add_argument("--server-addr", required=True, help="retrieval server host:port over the same corpus")
    parser.add_argument("--model", nargs="+", required=True, help="HF model directories to score")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--max-passage-tokens", type=int, default=48)
    parser.add_argument("--max-obs-tokens", type=int, default=160)
    args = parser.parse_args(argv)
    try:
        records = load_records(args.data)[: args.questions]
        scripts = SyntheticScripts(records, BehaviourMix())
    except (ValueError, OSError) as exc:
        print(f"answer_copy_probe: {exc}", file=sys.stderr)
        return 1
    # Four turns: the subject search, the bridge search and the answer always fit.
    loop_config = AgentLoopConfig(max_turns=4, max_tokens_per_turn=64, max_obs_tokens=args.max_obs_tokens,
                                  max_passage_tokens=args.max_passage_tokens, topk=args.topk)
    vocab, trajectories, found = None, [], []
    for model_dir in args.model:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        if tokenizer.get_vocab() != vocab:  # the scripted searches are the same token ids for every model that shares it
            vocab = tokenizer.get_vocab()
            trajectories = asyncio.run(_collect_from_server(records, lambda record, rng: scripts.good_search(record),
                                                            tokenizer, args.server_addr, loop_config, 0))
            found = [gold_in_passages(t, r, tokenizer) for t, r in zip(trajectories, records)]
        scores = score_trajectories(model, trajectories, tokenizer, pad_id=tokenizer.pad_token_id or 0)
        copied = sum(score.answer_copied for score, f in zip(scores, found) if f)
        query_copied = sum(score.query_copied for score in scores)
        query_logprob = sum(score.query_logprob for score in scores) / max(1, len(scores))
        print(f"{model_dir}: answer copied in {copied} of {sum(found)} questions with the gold answer in the "
              f"passages ({copied / max(1, sum(found)):.3f}); query copied in {query_copied} of {len(records)} "
              f"({query_copied / max(1, len(records)):.3f}, mean log-prob of the query tokens {query_logprob:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
