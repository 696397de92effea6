"""A run's trajectories and curves in the browser: ``rlinf-search view RUN_DIR`` (or ``python -m rlinf_search.viewer``).

    rlinf-search view outputs/demo/rl [--host 127.0.0.1] [--port 8765] [--save-address-to FILE]

Serves a page on loopback over the run's rollout dumps (``runner.rollout_dump: N``), metrics and the collapse
monitors' firings: steps and groups, each trajectory's turns (queries, passages with the gold answer marked,
reward, advantage, finish reason), its tokens coloured by whether they trained and by the policy version that sampled
them, filters, one prompt followed across steps, and the curves with the monitors' firings marked. ``--port 0``
takes a free port (``--save-address-to`` writes where).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlinf_search.net.serving import bind_socket, serve_forever


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlinf-search view", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a training run's runner.output_dir")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    parser.add_argument("--port", type=int, default=8765, help="port (0: a free one)")
    parser.add_argument("--save-address-to", default=None, help="write host:port here once it listens")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"view: {run_dir} is not a folder (give a run's runner.output_dir)", file=sys.stderr)
        return 2
    if not (run_dir / "rollouts").is_dir() and not any(run_dir.glob("**/metrics.jsonl")):
        print(f"view: {run_dir} has no rollouts/ and no metrics.jsonl: not a run folder", file=sys.stderr)
        return 2
    from rlinf_search.viewer.app import viewer_app

    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"view: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    serve_forever(viewer_app(run_dir), sock, address_file=args.save_address_to,
                  on_started=lambda address: print(f"viewing {run_dir} at http://{address}/", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
