"""Async agent loop vs the reference batch-per-turn loop: same engine, same real retrieval server.

    python benchmarks/agent_rollout.py [--trajectories 64] [--repeats 2] [--latencies-ms 0,250,1000]

Search latency is swept by a loopback TCP proxy that delays each request on its way to the server
(a remote or shared search service); 0 is the local server direct.

The policy is the tiny Qwen2 warm-started (SFT) to search one or two times with thoughts of varied
length, so turn lengths differ across trajectories as they do for a real model. Both schedules run
the same code per turn; only the schedule differs (`SearchR1AgentLoop.run_batch` vs `run_lockstep`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_search.agents.config import AgentLoopConfig
from rlinf_search.agents.searchr1.loop import SearchR1AgentLoop  # noqa: E402
from rlinf_search.agents.searchr1.metrics import rollout_metrics  # noqa: E402
from rlinf_search.data.io_struct import QARecord, SamplingParams  # noqa: E402
from rlinf_search.retrieval.build_index import main as build_index_main  # noqa: E402
from rlinf_search.retrieval.launch import RetrievalServerProcess  # noqa: E402
from rlinf_search.tools.search import SearchToolConfig, build_search_tool  # noqa: E402
from rlinf_search.workers.rollout.hf_engine import HFEngineConfig, HFGenerationEngine  # noqa: E402
from toolkits.make_tiny_model import make_tiny_model  # noqa: E402
from toolkits.sft_training import SFTConfig, SFTStage  # noqa: E402
from toolkits.sft_warmstart import collect_trajectories, warm_start  # noqa: E402

DATA = ROOT / "tests" / "data" / "hotpotqa_100"


def load_records() -> list[QARecord]:
    rows = [json.loads(line) for line in (DATA / "test.jsonl").read_text().splitlines()]
    return [QARecord(uid=f"hotpotqa-{r['id']}", prompt=[{"role": "user", "content": r["question"]}],
                     golden_answers=r["golden_answers"], data_source="hotpotqa", question=r["question"])
            for r in rows]


def search_script(record: QARecord, rng: random.Random) -> list[str]:
    """Think for a varied while, search once or twice, answer: lengths differ across trajectories."""
    words = record.question.rstrip("?").split()

    def thought() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(0, 25)))

    turns = [f"<think> {thought()} </think> <search> {record.question} </search>"]
    if rng.random() < 0.5:
        turns.append(f"<think> {thought()} </think> <search> {' '.join(words[-4:])} </search>")
    turns.append(f"<think> {thought()} </think> <answer> {record.golden_answers[0]} </answer>")
    return turns


def prepare(work: Path, server_url_addr: str, loop_config: AgentLoopConfig) -> Path:
    """Make and warm-start the tiny policy once; later runs reuse it."""
    sft_dir = work / "tiny-sft"
    if (sft_dir / "config.json").is_file():
        return sft_dir
    base = make_tiny_model(work / "tiny-base", [DATA / "corpus.jsonl", DATA / "test.jsonl"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)

    async def collect():
        # The client's connections and locks belong to one event loop: build it inside the loop that uses it.
        tool = build_search_tool(SearchToolConfig(server_addr=server_url_addr))
        try:
            return await collect_trajectories(load_records() * 4, search_script, tool, tokenizer, loop_config)
        finally:
            await tool.aclose()

    trajectories = asyncio.run(collect())
    warm_start(base, sft_dir, [SFTStage("search", trajectories, 250)], SFTConfig(batch_size=16, lr=3e-3))
    return sft_dir


class DelayProxy:
    """Forwards TCP connections to ``upstream``, holding each client chunk (one HTTP request) ``delay_s``."""

    def __init__(self, upstream: str, delay_s: float):
        self.upstream_host, port = upstream.rsplit(":", 1)
        self.upstream_port, self.delay_s = int(port), delay_s
        self.server: asyncio.base_events.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _pipe(self, reader, writer, delay_s: float) -> None:
        try:
            while chunk := await reader.read(65536):
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        self._writers += [client_writer, server_writer]
        try:
            await asyncio.gather(self._pipe(client_reader, server_writer, self.delay_s),
                                 self._pipe(server_reader, client_writer, 0.0))
        except asyncio.CancelledError:
            pass  # the event loop is shutting down with the connection still open

    async def stop(self) -> None:
        for writer in self._writers:  # ends the pipes, so no task is left for the loop to cancel
            writer.close()
        self.server.close()
        await self.server.wait_closed()


async def run_schedules(engine, server_addr: str, config: AgentLoopConfig, records, repeats: int,
                        latency_s: float) -> dict:
    proxy = DelayProxy(server_addr, latency_s)
    tool = build_search_tool(SearchToolConfig(server_addr=await proxy.start(), cache_size=0))
    loop = SearchR1AgentLoop(engine, tool, engine.tokenizer, config)
    results = {"async": [], "lockstep": []}
    for repeat in range(repeats):
        # Alternate the order so drift in machine load does not favour one schedule.
        order = ("async", "lockstep") if repeat % 2 == 0 else ("lockstep", "async")
        for name in order:
            schedule = loop.run_batch if name == "async" else loop.run_lockstep
            started = time.perf_counter()
            trajectories = await schedule(records)
            seconds = time.perf_counter() - started
            metrics = rollout_metrics(trajectories)
            results[name].append({
                "seconds": seconds,
                "trajectories_per_s": len(trajectories) / seconds,
                "model_tokens_per_s": metrics["rollout/model_tokens"] * len(trajectories) / seconds,
                "searches_per_trajectory": metrics["rollout/searches_per_trajectory"],
                "model_tokens_per_trajectory": metrics["rollout/model_tokens"],
            })
    await tool.aclose()
    await proxy.stop()
    return results


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def print_table(sweep: dict[float, dict], n: int) -> None:
    print(f"\n{n} trajectories, up to 2 searches each, HF engine on CPU, real BM25 server behind a delay proxy")
    print(f"{'search latency':>15}{'async traj/s':>14}{'lockstep traj/s':>17}{'ratio':>8}"
          f"{'async tok/s':>13}{'lockstep tok/s':>16}{'searches/traj':>15}")
    for latency_ms, results in sweep.items():
        a, b = results["async"], results["lockstep"]
        ratio = _mean(a, "trajectories_per_s") / _mean(b, "trajectories_per_s")
        print(f"{latency_ms:>12.0f} ms{_mean(a, 'trajectories_per_s'):>14.2f}{_mean(b, 'trajectories_per_s'):>17.2f}"
              f"{ratio:>7.2f}x{_mean(a, 'model_tokens_per_s'):>13.0f}{_mean(b, 'model_tokens_per_s'):>16.0f}"
              f"{_mean(a + b, 'searches_per_trajectory'):>15.2f}")


def plot(sweep: dict[float, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latencies = list(sweep)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, color in (("async", "tab:blue"), ("lockstep", "tab:gray")):
        ax.plot(latencies, [_mean(sweep[l][name], "trajectories_per_s") for l in latencies], "o-",
                color=color, label=name)
    ax.set_xlabel("search latency (ms)")
    ax.set_ylabel("trajectories / s")
    ax.set_title("Search-R1 rollouts: async vs batch-per-turn")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--latencies-ms", default="0,250,1000", help="search latencies to sweep")
    parser.add_argument("--work-dir", default=str(ROOT / "outputs" / "bench" / "agent_rollout"))
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--plot-out", default=str(ROOT / "docs" / "img" / "agent_rollout.png"))
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    index_dir = work / "index"
    if not (index_dir / "bm25" / "manifest.json").is_file():
        build_index_main(["--corpus", str(DATA / "corpus.jsonl"), "--out", str(index_dir), "--retriever", "bm25"])
    config = AgentLoopConfig(max_turns=2, max_tokens_per_turn=192, max_response_tokens=1024,
                             sampling=SamplingParams(temperature=1.0))
    server_args = ["--index-dir", str(index_dir), "--corpus", str(DATA / "corpus.jsonl"), "--retriever", "bm25"]
    with RetrievalServerProcess(server_args) as server:
        model_dir = prepare(work, server.address, config)
        engine = HFGenerationEngine(HFEngineConfig(str(model_dir), seed=0))
        records = (load_records() * 2)[: args.trajectories]
        sweep = {}
        for latency_ms in [float(x) for x in args.latencies_ms.split(",")]:
            sweep[latency_ms] = asyncio.run(run_schedules(engine, server.address, config, records, args.repeats,
                                                          latency_ms / 1000.0))
    print_table(sweep, len(records))
    plot(sweep, Path(args.plot_out))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(sweep, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
