"""``python -m web.gym --template FILE [--host H] [--port P] [--allow-from CIDR]... [--require-token] [--threads N]
[--poll S] [--all-chains]``: what ``polar gym-agent`` runs (the CLI parses and checks the flags, then hands over to
this process)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web

from polar.config import load_config
from polar.errors import ValidationError
from polar.loaders.template import compile_template
from web.api.auth import check_tokens
from web.gym.access import Access, allow_list
from web.gym.app import create_app
from web.services import web_services


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="polar gym-agent")
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--allow-from", action="append", default=[])
    parser.add_argument("--require-token", action="store_true")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.25)
    parser.add_argument("--all-chains", action="store_true")
    args = parser.parse_args(argv)
    template = compile_template(args.template.read_text(), str(args.template), rows_fill_values_only=True)
    config = load_config()
    try:  # the token the API takes, checked as the API checks it (set, long enough)
        access = Access(allow_list(args.allow_from), check_tokens(config).admin if args.require_token else None)
    except ValidationError as exc:
        parser.error(str(exc))
    services = web_services(config, "gym-agent")
    allowed = ", ".join(str(network) for network in access.networks)
    token = "; Authorization: Bearer <POLAR_API_TOKEN> required" if access.token else ""
    print(f"Polar gym agent: POST http://{args.host}:{args.port}/run (template {args.template}; "
          f"callers from {allowed}{token})", flush=True)  # fmt: skip
    app = create_app(services, template, args.threads, args.poll, access, args.all_chains)
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
