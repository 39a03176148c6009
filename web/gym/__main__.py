"""``python -m web.gym --template FILE [--host H] [--port P] [--threads N] [--poll S]``: what ``polar gym-agent``
runs (the CLI parses and checks the flags, then hands over to this process)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

from polar.config import load_config
from polar.loaders.template import compile_template
from web.gym.app import create_app
from web.services import web_services


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="polar gym-agent")
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.25)
    args = parser.parse_args(argv)
    template = compile_template(args.template.read_text(), str(args.template))
    services = web_services(load_config(), "gym-agent")
    print(f"Polar gym agent: POST http://{args.host}:{args.port}/run (template {args.template})", flush=True)
    app = create_app(services, template, args.threads, args.poll)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
