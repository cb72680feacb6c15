"""`tame paths`: the links the store (or the server at TAME_URL) knows, each control's fit and its age."""

from __future__ import annotations

import os

from advisor.cli import UsageError
from advisor.commands.common import print_json, service_token, service_url, site_name


def register(subparsers) -> None:
    parser = subparsers.add_parser("paths", help="list the links with stored advice (the server's at TAME_URL when set)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--src", type=site_name, metavar="SITE", default=None,
                        help="list only the links from this site (default: every site's)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    paths = _remote_paths(args.src) if os.environ.get("TAME_URL") else _local_paths(args.src)
    if args.json:
        print_json({"paths": paths})
        return 0
    if not paths:
        print("no destinations yet: request a probe with `POST /v1/probes` or run `tame agent --dest-file FILE`")
        return 0
    # A link is (source, destination) and its advice is kept per control: a row each, named by all three.
    print(f"{'source':<16} {'destination':<32} {'control':<15} {'model':<6} {'regime':<12} {'age':>8}  {'stale':<5}  "
          "probe due")
    for p in paths:
        age = p["age_s"]
        age_text = f"{age / 3600:.1f}h" if age >= 3600 else f"{age:.0f}s"
        # A fit that did not record its control answers the service's default control's queries until one under it
        # is stored (docs/advice-service.md).
        control = p["congestion_control"] or "(not recorded)"
        print(f"{p['src']:<16} {p['dest']:<32} {control:<15} {p['model']:<6} {p['regime']:<12} {age_text:>8}  "
              f"{'yes' if p['stale'] else 'no':<5}  {p['reprobe_due'] or '-'}")
    return 0


def _local_paths(src: str | None) -> list[dict]:
    from advisor.commands.runtime import load_settings, open_store
    from advisor.service import AdviceService

    settings = load_settings()
    store = open_store(settings, create=False)
    try:
        return AdviceService(store, settings).paths(src)
    finally:
        store.close()


def _remote_paths(src: str | None) -> list[dict]:
    from api.client import TameClient, TameError  # the CLI is where the layers are wired together

    server = service_url(os.environ.get("TAME_URL"))
    with TameClient(server, token=service_token(read_first=True)) as client:
        try:
            return client.paths(src)
        except TameError as exc:
            raise UsageError(f"{client.shown_url}: {exc}") from exc
