"""``python -m rlinf_search.serve --model DIR``: an OpenAI-compatible server (completions and chat) over a Hugging
Face model (CPU or one GPU): a distillation teacher where ``vllm serve`` is not installed, or any OpenAI client."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rlinf_search.net.header_timeout import HEADER_TIMEOUT_S
from rlinf_search.net.serving import bind_socket, serve_forever
from rlinf_search.serve.app import API_KEY_ENV, create_app
from rlinf_search.serve.completion_model import CompletionModel

log = logging.getLogger("rlinf_search.serve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_search.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--served-model-name", default=None, help="the name requests use (default: --model)")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port (see --save-address-to)")
    parser.add_argument("--save-address-to", default=None, help="write host:port here once listening")
    parser.add_argument("--header-timeout-s", type=float, default=HEADER_TIMEOUT_S,
                        help="a client whose request headers are not complete this long after it connected gets 408")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1 routes (default: ${API_KEY_ENV}, if set); "
                             "prefer the variable: a flag shows in the process list")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if not Path(args.model).is_dir():
            raise FileNotFoundError(f"--model {args.model}: no such model directory")
        model = CompletionModel(args.model, dtype=args.dtype)
        sock = bind_socket(args.host, args.port)
    except (OSError, ValueError) as exc:
        print(f"completions server: {exc}", file=sys.stderr)
        return 1
    name = args.served_model_name or args.model
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = create_app(model, served_name=name, api_key=api_key)
    serve_forever(app, sock, address_file=args.save_address_to, header_timeout_s=args.header_timeout_s,
                  on_started=lambda address: log.info(
        "serving %s as %r on %s (%s)", args.model, name, address, "API key required" if api_key else "no API key"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
