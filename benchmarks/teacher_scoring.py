"""What the distillation teacher costs the driver per step, at the GPU recipe's shape, against a simulated server.

    python benchmarks/teacher_scoring.py                                  # 2,560 trajectories x 4,096 tokens, k = 8
    python benchmarks/teacher_scoring.py --trajectories 256 --top-k 0     # smaller, sampled-token term only

The server is simulated so that only the client side is measured: a real HTTP server on loopback, in a
process of its own, answering each ``/v1/completions`` request with a vLLM-shaped echo of the right size
(``token_logprobs`` for every prompt token, and with ``top_k`` > 0 ``top_logprobs`` of k + 1 entries keyed
``token_id:<id>``, as vLLM lists the given token beside the k), built from precomputed fragments so that
it answers faster than the client reads. The client is the one the driver runs (``TeacherScorer``: its
event-loop thread, the retrying caller, JSON parsing, the top-k tensors, the alignment, then ``apply``:
the advantage term and the ``[B, T, k]`` tensors the batch carries to the actor). Printed: seconds for the
requests to come back and be read, seconds for ``apply``, bytes received, and bytes the batch carries.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _serve(port_out, sent_bytes, max_tokens: int, top_k: int) -> None:
    """The simulated teacher: per position a precomputed JSON fragment, joined to the request's length."""
    rng = random.Random(0)
    values = [f"{-rng.random() * 5:.6f}" for _ in range(max_tokens)]
    tops = ["{" + ", ".join(f'"token_id:{rng.randrange(150000)}": {-rng.random() * 5:.6f}' for _ in range(top_k + 1))
            + "}" for _ in range(max_tokens)]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = len(body["prompt"]) + 1  # the echoed prompt and the token generated
            logprobs = '{"tokens": null, "token_logprobs": [null, ' + ", ".join(values[1:n]) + "]"
            if body.get("logprobs"):
                logprobs += ', "top_logprobs": [null, ' + ", ".join(tops[1:n]) + "]"
            payload = ('{"id": "cmpl-sim", "object": "text_completion", "choices": [{"index": 0, "text": "x", '
                       '"logprobs": ' + logprobs + "}}]}").encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            with sent_bytes.get_lock():
                sent_bytes.value += len(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def _trajectories(count: int, row_tokens: int, prompt_tokens: int):
    from rlinf_search.data.io_struct import QARecord, Trajectory

    rng = random.Random(1)
    records, trajectories = [], []
    for i in range(count):
        length = rng.randint(row_tokens // 4, row_tokens - prompt_tokens)  # Search-R1's spread of lengths
        mask = [1] * length
        for start in (length // 4, length // 2):  # two observation blocks
            mask[start:start + length // 8] = [0] * (length // 8)
        records.append(QARecord(uid=f"q{i}", prompt="", golden_answers=["x"], data_source="sim"))
        trajectories.append(Trajectory(uid=f"q{i}", prompt_ids=[rng.randrange(150000) for _ in range(prompt_tokens)],
                                       response_ids=[rng.randrange(150000) for _ in range(length)],
                                       response_mask=mask, rollout_logprobs=[0.0] * length))
    return records, trajectories


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=2560, help="per step (the 3B recipe: 512 x 5)")
    parser.add_argument("--row-tokens", type=int, default=4096, help="longest prompt + response")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32, help="algorithm.distill.teacher.max_concurrency")
    args = parser.parse_args(argv)

    import torch
    from tqdm import tqdm

    from rlinf_search.data.batch import collate_trajectories
    from rlinf_search.distill.config import DistillConfig, TeacherConfig
    from rlinf_search.distill.scorer import TeacherScorer

    ports, sent = mp.Queue(), mp.Value("q", 0)
    server = mp.Process(target=_serve, args=(ports, sent, args.row_tokens + 1, args.top_k), daemon=True)
    server.start()
    port = ports.get(timeout=60)
    records, trajectories = _trajectories(args.trajectories, args.row_tokens, args.prompt_tokens)
    batch = collate_trajectories(trajectories, [0.0] * len(trajectories), pad_id=0)
    batch.advantages = torch.zeros(batch.response_mask.shape)
    batch.old_logprobs = torch.zeros(batch.response_mask.shape)
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    config = DistillConfig(teacher=TeacherConfig(base_url=f"http://127.0.0.1:{port}/v1", model="sim",
                                                 max_concurrency=args.concurrency, deadline_s=3600, timeout_s=600),
                           top_k=args.top_k)
    scorer = TeacherScorer(config, student_tokenizer=None)
    try:
        started = time.perf_counter()
        scoring = scorer.start(records, trajectories)
        for future in tqdm(scoring._futures, desc="teacher answers", unit="traj", mininterval=5):
            future.result()
        answered = time.perf_counter() - started
        started = time.perf_counter()
        metrics = scorer.apply(batch, scoring)
        applied = time.perf_counter() - started
    finally:
        scorer.close()
        server.terminate()
    failures = [message for _, _, message in scoring.result() if message]
    if failures:
        raise SystemExit(f"{len(failures)} trajectories failed, e.g. {failures[0]}")
    carried = sum(t.numel() * t.element_size() for t in (batch.teacher_top_ids, batch.teacher_top_logprobs,
                                                          batch.teacher_top_weight) if t is not None)
    print(f"{args.trajectories} trajectories, {tokens / 1e6:.1f} M tokens (prompt {args.prompt_tokens}, rows up to "
          f"{args.row_tokens}), top_k {args.top_k}, concurrency {args.concurrency}; torch {torch.__version__}")
    print(f"{'requests answered and read':<34}{answered:>9.1f} s   ({tokens / answered / 1e6:.2f} M tokens/s)")
    print(f"{'apply (term + top-k tensors)':<34}{applied:>9.1f} s")
    print(f"{'bytes received':<34}{sent.value / 2**30:>9.2f} GiB ({sent.value / tokens:.0f} B a token)")
    print(f"{'top-k tensors the batch carries':<34}{carried / 2**30:>9.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
