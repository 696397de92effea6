"""Retrieval server throughput: dynamic batching against the reference one-request-at-a-time server.

    python benchmarks/retrieval_qps.py                       # minilm Flat on hotpotqa_100, 10 s per cell

Builds (or reuses) a minilm index on the HotpotQA-100 corpus, then starts the real server twice on
loopback, once with dynamic batching (the default) and once with ``--no-batching`` (each request
encoded on its own in the web framework's thread pool, as Search-R1's and RLinf's servers do). For
each number of concurrent clients it drives one-query requests for a fixed time and records
queries/s and latency percentiles. Beside them, the server's ceiling: the same retriever searched in-process at
batch sizes 1-64, one batch at a time or two at once on half the cores each (``benchmarks/encoder_ceiling.py``), in
the same run on the same cores, its best rate the most a server with free HTTP could serve; and the share of the
one-batch-at-a-time ceiling. Prints a table, writes JSON and a PNG plot.

Clients and server share the machine's cores, and so may other jobs: each cell first waits for
other processes to go idle, records the CPU they used during the cell ("other load"), and is
measured again (up to ``--attempts`` times) when that exceeds ``--max-other-cores``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http_load import CLIENTS, drive_load  # noqa: E402
from rlinf_search.retrieval import build_index  # noqa: E402
from rlinf_search.retrieval.corpus import CorpusStore  # noqa: E402
from rlinf_search.retrieval.launch import RetrievalServerProcess  # noqa: E402
from rlinf_search.retrieval.manifest import IndexManifest, IndexMismatchError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HOTPOT = REPO / "tests" / "data" / "hotpotqa_100"
MODES = {"batching": [], "no-batching": ["--no-batching"]}


@dataclass
class CellResult:
    """One (mode, clients) measurement."""

    mode: str
    """``batching`` or ``no-batching``."""
    clients: int
    """Concurrent clients, each with one request in flight at a time."""
    requests: int
    """Requests that completed with HTTP 200 inside the measured run."""
    errors: int
    """Requests that failed (non-200 or transport error)."""
    seconds: float
    """Wall time from the first request sent to the last response received."""
    qps: float
    """Completed queries per second (one query per request)."""
    p50_ms: float
    """Median request latency seen by the client, milliseconds."""
    p99_ms: float
    """99th percentile request latency seen by the client, milliseconds."""
    mean_batch_size: float
    """Queries per encoder call on the server during this cell (from ``GET /metrics``)."""
    search_busy: float
    """Share of the cell's wall time the server's batch threads spent searching (summed over threads, so up to the
    number of batch threads): below 1 with one batch thread, the encoder waited on HTTP and batching."""
    other_cores: float
    """CPU used by processes other than this benchmark and its server during the cell, in cores;
    the machine is shared, and anything above ~0.1 here means the cell was measured under contention."""
    server_cores: float
    """CPU the server process used during the cell, in cores (encoder, event loop, HTTP)."""
    client_cores: float
    """CPU the load generator (this process) used during the cell, in cores: taken from the server's share when
    both run on the same cores."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(HOTPOT / "corpus.jsonl"), help="Search-R1 corpus jsonl")
    parser.add_argument("--questions", default=str(HOTPOT / "test.jsonl"),
                        help="jsonl with a 'question' field; queries are drawn from it")
    parser.add_argument("--retriever", default="minilm", help="dense encoder (or bm25) to serve")
    parser.add_argument("--work-dir", default="outputs/bench/qps", help="built indexes are cached here")
    parser.add_argument("--clients", default="1,8,32,64", help="comma-separated concurrency levels")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration of each cell")
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured load before each cell")
    parser.add_argument("--topk", type=int, default=3, help="passages per query (Search-R1 uses 3)")
    parser.add_argument("--query-precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="the server's --query-precision, and the ceiling's")
    parser.add_argument("--ceiling-seconds", type=float, default=3.0,
                        help="in-process search timed per batch size for the ceiling (0: no ceiling)")
    parser.add_argument("--client", choices=CLIENTS, default="raw",
                        help="load generator: raw keep-alive HTTP/1.1 (least CPU taken from the server on shared "
                             "cores) "
                             "or httpx (as the search tool); benchmarks/http_load.py")
    parser.add_argument("--modes", default="batching,no-batching", help=f"subset of {list(MODES)}")
    parser.add_argument("--server-args", default="",
                        help="extra server flags for the batching mode, e.g. '--batch-window-ms 5 --max-batch 32'")
    parser.add_argument("--json-out", default="outputs/bench/qps/retrieval_qps.json")
    parser.add_argument("--plot-out", default="docs/img/retrieval_qps.png")
    parser.add_argument("--seed", type=int, default=0, help="seeds each client's query order")
    parser.add_argument("--quiet-wait-s", type=float, default=300.0,
                        help="before each cell, wait up to this long for other processes to go idle (0: no wait)")
    parser.add_argument("--max-other-cores", type=float, default=0.2,
                        help="re-measure a cell when other processes used more CPU than this during it")
    parser.add_argument("--attempts", type=int, default=3, help="most measurements of one cell")
    return parser


def ensure_index(corpus_path: Path, index_dir: Path, retriever: str) -> None:
    """Build the index unless ``index_dir/<retriever>`` already holds one built on this corpus."""
    try:
        with CorpusStore(corpus_path) as corpus:
            IndexManifest.load(index_dir / retriever).check_corpus(corpus.fingerprint, str(corpus_path))
        print(f"reusing {retriever} index in {index_dir / retriever}")
        return
    except IndexMismatchError:
        pass  # missing or built on another corpus: build it
    code = build_index.main(["--corpus", str(corpus_path), "--out", str(index_dir), "--retriever", retriever])
    if code != 0:
        sys.exit(f"index build failed with exit code {code}")


def load_questions(path: Path) -> list[str]:
    with open(path) as handle:
        return [json.loads(line)["question"] for line in handle if line.strip()]


def _batch_totals(base_url: str) -> tuple[int, int, float]:
    """(batches, queries batched, seconds spent searching) so far, from the server's ``GET /metrics``."""
    snapshot = httpx.get(f"{base_url}/metrics", timeout=10.0).json()
    histogram = snapshot["batch_size_histogram"]
    queries = sum(int(size) * count for size, count in histogram.items())
    return snapshot["batches"], queries, snapshot.get("search_busy_s", 0.0)


class CpuAccount:
    """CPU time used on the machine by everything except the given processes, between two points."""

    def __init__(self, own_pids: list[int]):
        self._own = [psutil.Process(pid) for pid in own_pids]
        self._start = self._read()

    def _read(self) -> tuple[float, float, list[float]]:
        system = psutil.cpu_times()
        # Process time only: interrupt time (loopback networking runs there) belongs to no process.
        busy = system.user + system.nice + system.system
        each = [sum(p.cpu_times()[:4]) for p in self._own]  # user, system, children user/system
        return time.perf_counter(), busy, each

    def cores_of(self, index: int) -> float:
        """Average cores used by the ``index``-th of the given processes since this object was made."""
        now, _, each = self._read()
        return (each[index] - self._start[2][index]) / (now - self._start[0])

    def other_cores(self) -> float:
        """Average cores used by other processes since this object was made."""
        now, busy, each = self._read()
        wall, busy0, each0 = now - self._start[0], self._start[1], self._start[2]
        return max(0.0, (busy - busy0) - (sum(each) - sum(each0))) / wall


def wait_for_quiet(own_pids: list[int], timeout_s: float, *, max_other_cores: float = 0.15) -> None:
    """Wait until other processes use under ``max_other_cores`` for 2 s, or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        account = CpuAccount(own_pids)
        time.sleep(2.0)
        if account.other_cores() < max_other_cores:
            return
    if timeout_s > 0:
        tqdm.write(f"machine still busy after {timeout_s:.0f} s; measuring anyway (see other_cores)")


def measure_cell(base_url: str, queries: list[str], *, mode: str, clients: int, server_pid: int,
                 args: argparse.Namespace) -> CellResult:
    """Measure a cell, again when other processes disturbed it; keep the least disturbed attempt."""
    attempts = []
    for _ in range(max(1, args.attempts)):
        attempts.append(_measure_once(base_url, queries, mode=mode, clients=clients,
                                      server_pid=server_pid, args=args))
        if attempts[-1].other_cores <= args.max_other_cores:
            break
        tqdm.write(f"{mode} {clients} clients: other processes used {attempts[-1].other_cores:.2f} cores; "
                   "measuring again")
    return min(attempts, key=lambda r: r.other_cores)


def _measure_once(base_url: str, queries: list[str], *, mode: str, clients: int, server_pid: int,
                  args: argparse.Namespace) -> CellResult:
    """Warm up, then measure one concurrency level against a running server."""
    own_pids = [server_pid, os.getpid()]
    wait_for_quiet(own_pids, args.quiet_wait_s)
    asyncio.run(drive_load(base_url, queries, clients=clients, seconds=args.warmup_seconds,
                           topk=args.topk, seed=args.seed + 99, client=args.client))
    # /metrics is cumulative, so the cell's mean batch size comes from the difference.
    batches_before, queries_before, busy_before = _batch_totals(base_url)
    account = CpuAccount(own_pids)
    latencies, errors, wall = asyncio.run(drive_load(base_url, queries, clients=clients, seconds=args.seconds,
                                                     topk=args.topk, seed=args.seed, client=args.client))
    other_cores = account.other_cores()
    server_cores, client_cores = account.cores_of(0), account.cores_of(1)
    batches_after, queries_after, busy_after = _batch_totals(base_url)
    batches = batches_after - batches_before
    lat_ms = np.asarray(latencies) * 1000.0
    return CellResult(
        mode=mode, clients=clients, requests=len(latencies), errors=errors, seconds=round(wall, 3),
        qps=round(len(latencies) / wall, 2),
        p50_ms=round(float(np.percentile(lat_ms, 50)), 2) if lat_ms.size else float("nan"),
        p99_ms=round(float(np.percentile(lat_ms, 99)), 2) if lat_ms.size else float("nan"),
        mean_batch_size=round((queries_after - queries_before) / batches, 2) if batches else 0.0,
        search_busy=round((busy_after - busy_before) / wall, 3),
        other_cores=round(other_cores, 2), server_cores=round(server_cores, 2), client_cores=round(client_cores, 2),
    )


def run_ceiling(base_args: list[str], args: argparse.Namespace) -> dict | None:
    """The retriever's best in-process rate over batch sizes 1-64, one batch at a time or two at once, measured in a
    fresh process as the server loads it (``benchmarks/encoder_ceiling.py``), once the machine is quiet."""
    if args.ceiling_seconds <= 0:
        return None
    out = Path(args.work_dir) / "ceiling.json"
    wait_for_quiet([os.getpid()], args.quiet_wait_s)
    command = [sys.executable, str(Path(__file__).with_name("encoder_ceiling.py")), *base_args,
               "--questions", args.questions, "--query-precision", args.query_precision,
               "--seconds", str(args.ceiling_seconds), "--topk", str(args.topk), "--json-out", str(out)]
    done = subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        sys.exit(f"encoder ceiling failed: {last}")
    tqdm.write(done.stdout.rstrip())
    return json.loads(out.read_text())


def run_mode(mode: str, server_args: list[str], queries: list[str], args: argparse.Namespace,
             levels: list[int], bar: tqdm) -> list[CellResult]:
    """Start the server in one mode and measure every concurrency level against it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log_path = Path(args.work_dir) / f"server_{mode}.log"
    results = []
    with RetrievalServerProcess(server_args, log_path=log_path, env=env) as server:
        for clients in levels:
            bar.set_postfix_str(f"{mode}, {clients} clients")
            results.append(measure_cell(server.url, queries, mode=mode, clients=clients,
                                        server_pid=server.process.pid, args=args))
            bar.update(1)
    return results


def print_table(results: list[CellResult], levels: list[int], ceilings: list[dict] = ()) -> None:
    """``ceilings``: ``encoder_ceiling``'s results (before and after the cells); shares are of the higher one."""
    best = max((c["best"] for c in ceilings), key=lambda cell: cell["qps"], default=None)
    ceiling = best["qps"] if best else None
    # The ceiling as first defined: one batch at a time on every core (the server's only layout before).
    one = max((cell["qps"] for c in ceilings for cell in c["cells"] if cell["streams"] == 1), default=None)
    by_key = {(r.mode, r.clients): r for r in results}
    if ceiling:
        measured = " and ".join(f"{c['best']['qps']:.1f}" for c in ceilings)
        print(f"ceiling: {ceiling:.1f} queries/s, the retriever's best in-process rate over batch sizes 1-64, "
              f"one batch at a time or two at once (best: {best['streams']} x batch {best['batch_size']}; "
              f"measured before and after the cells: {measured}); one batch at a time: {one:.1f}")
    header = (f"{'clients':>7} | {'batching qps':>12} | {'of ceiling':>10} | {'of 1-batch':>10} | "
              f"{'no-batch qps':>12} | {'ratio':>6} | "
              f"{'batching p50/p99 ms':>19} | {'no-batch p50/p99 ms':>19} | {'mean batch':>10} | {'busy':>5} | "
              f"{'server/client cores':>19} | {'other load':>10}")
    print(header)
    print("-" * len(header))
    for clients in levels:
        on, off = by_key.get(("batching", clients)), by_key.get(("no-batching", clients))
        ratio = f"{on.qps / off.qps:.2f}x" if on and off and off.qps else "-"
        share = f"{on.qps / ceiling:.0%}" if on and ceiling else "-"
        share_one = f"{on.qps / one:.0%}" if on and one else "-"
        print(f"{clients:>7} | {on.qps if on else '-':>12} | {share:>10} | {share_one:>10} | "
              f"{off.qps if off else '-':>12} | "
              f"{ratio:>6} | "
              f"{_p50_p99(on):>19} | {_p50_p99(off):>19} | {on.mean_batch_size if on else '-':>10} | "
              f"{f'{on.search_busy:.0%}' if on else '-':>5} | "
              f"{_cores(on):>19} | {_other_load(on, off):>10}")
    print("busy: share of the cell the batching server's encoder spent searching; "
          "server/client cores: CPU of the batching server and of the load generator during the cell; other load: "
          "cores used by other processes on the machine (batching / no-batch)")
    errors = sum(r.errors for r in results)
    if errors:
        print(f"WARNING: {errors} requests failed; see the server logs in the work dir")


def _other_load(*cells: CellResult | None) -> str:
    """Cores used by other processes during the two cells of a row, batching / no-batch."""
    return " / ".join(f"{c.other_cores:.2f}" if c else "-" for c in cells)


def _cores(result: CellResult | None) -> str:
    return f"{result.server_cores:.2f} / {result.client_cores:.2f}" if result else "-"


def _p50_p99(result: CellResult | None) -> str:
    return f"{result.p50_ms:.1f} / {result.p99_ms:.1f}" if result else "-"


def plot(results: list[CellResult], path: Path, title: str, ceiling: float | None = None) -> None:
    """QPS and p99 latency against concurrency, one line per mode; the in-process ceiling as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, (ax_qps, ax_p99) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in MODES:
        cells = sorted((r for r in results if r.mode == mode), key=lambda r: r.clients)
        if cells:
            xs = [r.clients for r in cells]
            ax_qps.plot(xs, [r.qps for r in cells], marker="o", label=mode)
            ax_p99.plot(xs, [r.p99_ms for r in cells], marker="o", label=mode)
    if ceiling:
        ax_qps.axhline(ceiling, color="grey", ls="--", label="ceiling (in-process, best batch)")
    levels = sorted({r.clients for r in results})
    for ax, label in ((ax_qps, "queries / s"), (ax_p99, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_p99.set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = set(modes) - set(MODES)
    if unknown:
        sys.exit(f"unknown --modes {sorted(unknown)}; choose from {list(MODES)}")
    corpus_path = Path(args.corpus).resolve()
    index_dir = Path(args.work_dir) / "indexes" / corpus_path.parent.name
    ensure_index(corpus_path, index_dir, args.retriever)
    queries = load_questions(Path(args.questions))
    base_args = ["--index-dir", str(index_dir), "--corpus", str(corpus_path), "--retriever", args.retriever]
    # Measured before and after the cells: this machine's speed drifts by 10-25 % over minutes (shared host), and the
    # share of the ceiling is taken against the higher of the two.
    ceilings = [run_ceiling(base_args, args)]
    results: list[CellResult] = []
    with tqdm(total=len(modes) * len(levels), desc="qps cells", unit="cell", dynamic_ncols=True) as bar:
        for mode in modes:
            extra = args.server_args.split() if mode == "batching" else []
            results.extend(run_mode(mode, base_args + ["--query-precision", args.query_precision] + MODES[mode] + extra,
                                    queries, args, levels, bar))
    ceilings.append(run_ceiling(base_args, args))
    ceilings = [c for c in ceilings if c]
    rates = [c["best"]["qps"] for c in ceilings]
    print(f"\n{args.retriever} on {corpus_path.parent.name}, {args.seconds:.0f} s per cell, "
          f"{os.cpu_count()} CPUs, one query per request, topk {args.topk}")
    print_table(results, levels, ceilings)
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "cpus": os.cpu_count(), "ceilings": ceilings,
                               "results": [asdict(r) for r in results]}, indent=2))
    plot(results, Path(args.plot_out), f"{args.retriever} retrieval server, {os.cpu_count()}-core CPU",
         max(rates, default=None))
    print(f"wrote {out} and {args.plot_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
