"""`tame paths`: the destinations the store knows, with their fit and its age."""

from __future__ import annotations

from advisor.commands.common import print_json
from advisor.commands.runtime import load_settings, open_store
from advisor.service import AdviceService


def register(subparsers) -> None:
    parser = subparsers.add_parser("paths", help="list the destinations with stored advice")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def run(args) -> int:
    settings = load_settings()
    store = open_store(settings, create=False)
    try:
        paths = AdviceService(store, settings).paths()
    finally:
        store.close()
    if args.json:
        print_json({"paths": paths})
        return 0
    if not paths:
        print("no destinations yet: request a probe with `POST /v1/probes` or run `tame agent --dest-file FILE`")
        return 0
    # One row per link (source site, destination) and congestion control: "-" for a fit stored before controls
    # were recorded (it answers for the service's default control).
    src_width = max(8, *(len(p["src"]) for p in paths))
    print(f"{'source':<{src_width}} {'destination':<32} {'control':<15} {'model':<6} {'regime':<12} {'age':>8}  "
          f"{'stale':<5}  probe due")
    for p in paths:
        age = p["age_s"]
        age_text = f"{age / 3600:.1f}h" if age >= 3600 else f"{age:.0f}s"
        print(f"{p['src']:<{src_width}} {p['dest']:<32} {p['congestion_control'] or '-':<15} {p['model']:<6} "
              f"{p['regime']:<12} {age_text:>8}  {'yes' if p['stale'] else 'no':<5}  {p['reprobe_due'] or '-'}")
    return 0
