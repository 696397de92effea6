"""TRL's GRPOTrainer on the demo's Search-R1 task, as a user of TRL would set it up on a laptop CPU: the baseline
side of ``benchmarks/trl_grpo.py`` (run by it, in a venv of its own with ``trl`` from PyPI).

    .venv-trl/bin/python benchmarks/trl_searchr1.py --model DIR --data train.prepared.jsonl --server-addr HOST:PORT \
        --steps 12 --out times.jsonl

TRL has no Search-R1 protocol of its own (its ``tools`` are chat-template function calls), so the multi-turn
rollout is a ``rollout_func``, TRL's hook for custom generation, written the way TRL generates without vLLM:
one batched ``model.generate`` a turn over every trajectory still going, left-padded, stopped at ``</search>`` /
``</answer>``, the observations appended as ``env_mask`` 0 (kept out of the loss). The observation text, the
corrective turn and the reward are this project's own functions, so both sides see and score the same text.
Settings mirror ``examples/searchr1/config/tiny-cpu.yaml``: 16 prompts x 4, two optimizer steps a batch, KL 0.001
(k3, a reference copy), clip 0.2 / 0.28, token-mean loss, lr 1e-4, fp32.

Written per RL step, one JSON line: ``rollout_s`` (the rollout function), ``score_s`` (the rest of TRL's
generate-and-score: old and reference log-probs, reward, advantages), ``training_s`` (the two optimizer steps
without those), ``step_s``, and ``model_tokens`` / ``trajectories``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import httpx  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rlinf_search.agents.searchr1.protocol import INVALID_ACTION_OBSERVATION, STOPS, parse_action  # noqa: E402
from rlinf_search.agents.searchr1.loop import INFORMATION_TAIL, fit_observation, graded_text  # noqa: E402
from rlinf_search.data.io_struct import ResponseSpan  # noqa: E402
from rlinf_search.rewards.scores import em_reward  # noqa: E402
from rlinf_search.tools.search.local import parse_retrieve_response  # noqa: E402
from rlinf_search.tools.search.base import SearchOutcome  # noqa: E402
from rlinf_search.agents.tools.search import SearchFunctionTool  # noqa: E402


class SearchR1Rollout:
    """Search-R1's loop over HF ``generate``: up to ``max_turns`` searches, then one last turn."""

    def __init__(self, tokenizer, server_addr: str, *, topk: int, max_turns: int, max_new_tokens: int,
                 max_obs_tokens: int, max_passage_tokens: int):
        self.tokenizer, self.topk, self.max_turns = tokenizer, topk, max_turns
        self.max_obs_tokens = max_obs_tokens
        self.tail_ids = tokenizer.encode(INFORMATION_TAIL, add_special_tokens=False)
        self.http = httpx.Client(base_url=f"http://{server_addr}", timeout=30.0)
        # Only its passage layout is used (``results_text``): the same text our agent loop appends.
        self.layout = SearchFunctionTool(None, None, topk=topk, max_passage_tokens=max_passage_tokens,
                                         tokenizer=tokenizer)
        self.generation = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                           max_new_tokens=max_new_tokens, stop_strings=list(STOPS),
                                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        self.seconds = 0.0

    def search(self, queries: list[str]) -> list[str]:
        """One request for every query of the turn, each answer laid out as our search tool lays it out."""
        reply = self.http.post("/retrieve", json={"queries": queries, "topk": self.topk})
        reply.raise_for_status()
        hits = parse_retrieve_response(reply.json(), len(queries), self.topk)
        return [self.layout.results_text(SearchOutcome(query=q, hits=h)) for q, h in zip(queries, hits)]

    def observation_ids(self, text: str) -> list[int]:
        """The observation's ids held to the agent loop's limit, as the agent loop holds them."""
        tail = self.tail_ids if text.endswith(INFORMATION_TAIL) else []
        return fit_observation(self.tokenizer.encode(text, add_special_tokens=False), tail, self.max_obs_tokens)

    def generate(self, model, contexts: list[list[int]]) -> list[tuple[list[int], str]]:
        """One turn for every context: (new token ids, finish) with finish ``stop``, ``eos`` or ``length``."""
        pad = self.tokenizer.pad_token_id
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=self.generation,
                                 tokenizer=self.tokenizer)
        turns = []
        for row in out[:, width:].tolist():
            cut = row.index(self.tokenizer.eos_token_id) if self.tokenizer.eos_token_id in row else len(row)
            if pad != self.tokenizer.eos_token_id and pad in row[:cut]:
                cut = row.index(pad)
            text = self.tokenizer.decode(row[:cut])
            if any(stop in text for stop in STOPS):
                turns.append((row[:cut], "stop"))
            elif cut < len(row):
                turns.append((row[: cut + 1], "eos"))  # the end token is the model's, and trained
            else:
                turns.append((row, "length"))
        return turns

    def __call__(self, prompts: list[str], trainer) -> dict:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        prompt_ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        completion = [[] for _ in prompts]
        env_mask = [[] for _ in prompts]
        spans: list[list[ResponseSpan]] = [[] for _ in prompts]
        going = list(range(len(prompts)))
        for turn in range(self.max_turns + 1):
            outputs = self.generate(model, [prompt_ids[i] + completion[i] for i in going])
            searches, corrections, still = [], [], []
            for i, (new, finish) in zip(going, outputs):
                completion[i] += new
                env_mask[i] += [1] * len(new)
                text = self.tokenizer.decode(new, skip_special_tokens=True)
                spans[i].append(ResponseSpan(kind="model", text=text, start=0, end=0))
                action = parse_action(text)
                if action.kind == "answer" or finish == "eos" or turn == self.max_turns:
                    continue
                (searches if action.kind == "search" else corrections).append((i, action.content))
            for i, _ in corrections:
                self.append(i, INVALID_ACTION_OBSERVATION, "correction", completion, env_mask, spans)
                still.append(i)
            if searches:
                for (i, _), text in zip(searches, self.search([q for _, q in searches])):
                    self.append(i, f"\n\n<information>{text}</information>\n\n", "information",
                                completion, env_mask, spans)
                    still.append(i)
            going = sorted(still)
            if not going:
                break
        model.train(was_training)
        self.seconds += time.perf_counter() - started
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": None, "env_mask": env_mask,
                "graded": [graded_text(s) for s in spans]}

    def append(self, i: int, text: str, kind: str, completion, env_mask, spans) -> None:
        ids = self.observation_ids(text)
        completion[i] += ids
        env_mask[i] += [0] * len(ids)
        spans[i].append(ResponseSpan(kind=kind, text=self.tokenizer.decode(ids), start=0, end=0))


def exact_match(prompts, completions, graded, golden_answers, **_) -> list[float]:
    """The demo's reward (``reward.score: em``) on the text our reward worker grades."""
    return [em_reward(text, golds) for text, golds in zip(graded, golden_answers)]


class PhaseTimes(TrainerCallback):
    """One JSON line per RL step (two optimizer steps): the rollout, the rest of generate-and-score, training."""

    def __init__(self, rollout: SearchR1Rollout, trainer_ref: list, out: Path, optimizer_steps: int):
        self.rollout, self.trainer_ref, self.out = rollout, trainer_ref, out
        self.optimizer_steps = optimizer_steps
        self.step_s = 0.0
        self.began = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_s += time.perf_counter() - self.began
        if state.global_step % self.optimizer_steps:
            return
        trainer = self.trainer_ref[0]
        rollout_s, score_s = self.rollout.seconds, trainer.score_seconds - self.rollout.seconds
        tokens = trainer.last_model_tokens
        line = {"step": state.global_step // self.optimizer_steps, "rollout_s": rollout_s, "score_s": score_s,
                "training_s": self.step_s - rollout_s - score_s, "step_s": self.step_s,
                "model_tokens": tokens[0], "trajectories": tokens[1]}
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)
        self.rollout.seconds, trainer.score_seconds, self.step_s = 0.0, 0.0, 0.0


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with the time of its generate-and-score and the model tokens of the batch kept."""

    score_seconds = 0.0
    last_model_tokens = (0, 0)

    def _generate_and_score_completions(self, inputs):
        started = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.score_seconds += time.perf_counter() - started
        mask = out["completion_mask"] * out["tool_mask"] if out.get("tool_mask") is not None else out["completion_mask"]
        self.last_model_tokens = (int(mask.sum()), int(mask.shape[0]))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="the demo's train.prepared.jsonl")
    parser.add_argument("--server-addr", required=True)
    parser.add_argument("--steps", type=int, default=12, help="RL steps (batches of 16 prompts x 4)")
    parser.add_argument("--out", required=True, help="the JSON lines of phase times")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None, help="TRL's output_dir (nothing is saved there)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([
        {"prompt": tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
         "golden_answers": r["golden_answers"]} for r in rows])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    rollout = SearchR1Rollout(tokenizer, args.server_addr, topk=1, max_turns=2, max_new_tokens=64,
                              max_obs_tokens=160, max_passage_tokens=48)
    optimizer_steps = 2  # algorithm.n_minibatches: 2, ppo_epochs: 1
    config = GRPOConfig(
        output_dir=args.work_dir or str(Path(args.out).parent / "trl_work"), use_cpu=True, bf16=False,
        per_device_train_batch_size=32, gradient_accumulation_steps=1, steps_per_generation=optimizer_steps,
        num_generations=4, num_iterations=1, max_steps=args.steps * optimizer_steps,
        max_completion_length=1024, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.001, epsilon=0.2, epsilon_high=0.28, loss_type="bnpo", scale_rewards="group",
        learning_rate=1e-4, lr_scheduler_type="constant_with_warmup", warmup_steps=0.05, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        logging_steps=1, report_to="none", save_strategy="no", seed=args.seed, data_seed=args.seed,
        dataloader_num_workers=0, disable_tqdm=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    trainer_ref: list = []
    trainer = TimedGRPOTrainer(model=model, reward_funcs=[exact_match], args=config, train_dataset=dataset,
                               processing_class=tokenizer, rollout_func=rollout,
                               callbacks=[PhaseTimes(rollout, trainer_ref, out, optimizer_steps)])
    trainer_ref.append(trainer)
    trainer.train()


if __name__ == "__main__":
    main()
