"""`tame serve`: the HTTP API with the store and a local probe worker (the main job).

The CLI is the composition root, so this command imports the api package (lazily, inside
`run`) although advisor/ otherwise never imports api/.
"""

from __future__ import annotations


import argparse
import ipaddress
import sys

from advisor.cli import UsageError
from advisor.commands.common import port_number
from advisor.commands.runtime import default_driver, load_settings, open_store, setup_logging
from advisor.cpu_groups import store_scheduling_warning
from probes.controls import available_controls


EVERY_INTERFACE = "0.0.0.0 to listen on every interface (:: for IPv6 too), or 127.0.0.1 for this host only"


def listen_host(text: str) -> str:
    """A --host value: a name or an address a TCP server can listen on. Not empty (the socket layer reads "" as every
    interface: a service meant for this host would be open to the network) and not a multicast address."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no address; give {EVERY_INTERFACE}")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return text  # a host name: bind resolves it, and says so when it cannot
    if address.is_multicast:
        raise argparse.ArgumentTypeError(f"{text!r} is a multicast address, which no TCP server listens on; give an "
                                         f"address of this host, or {EVERY_INTERFACE}")
    return text


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the HTTP advice API with its store and probe worker",
        description="Configuration comes from the environment: TAME_DATABASE_URL (default sqlite file "
                    "./tame.sqlite3 or $XDG_DATA_HOME/tame/tame.sqlite3), TAME_TOKEN, TAME_READ_TOKEN, "
                    "TAME_SITE_TOKENS (site-a:TOKEN1,site-b:TOKEN2: each writes only its site's links), "
                    "TAME_ALLOWED_DESTINATIONS (default loopback only), TAME_TTL_S, TAME_MAX_CONCURRENT_PROBES; "
                    "the server's limits and timeouts are in docs/security.md.",
    )
    parser.add_argument("--host", type=listen_host, default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=port_number, default=8080, help="TCP port, 1-65535 (default 8080)")
    parser.add_argument("--no-worker", action="store_true", help="serve only; leave probes to a `tame agent`")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from api.app import create_app
    from api.server import bind, ensure_file_limit, http_url, serve_on

    setup_logging()
    settings = load_settings()
    url = http_url(args.host, args.port)
    try:
        if not args.no_worker and settings.congestion_control not in available_controls():
            raise UsageError(f"the probe worker would probe under {settings.congestion_control!r}, which this "
                             f"kernel does not offer ({' '.join(available_controls())}): set "
                             "TAME_CONGESTION_CONTROL to one of those, load its module, or run with --no-worker")
        # Bound before anything is said or opened, so "listening" is true when printed.
        sock = bind(args.host, args.port, settings.backlog)
    except OSError as exc:
        raise UsageError(f"cannot listen on {url.removeprefix('http://')}: {exc.strerror or exc} "
                         f"(choose another --port or --host)") from exc
    with sock:
        ensure_file_limit(settings.max_connections)
        store = open_store(settings)
        try:
            crowded = store_scheduling_warning(store.db)
            if crowded:
                print(f"tame serve: warning: {crowded}", file=sys.stderr, flush=True)
            driver = None if args.no_worker else default_driver()
            app = create_app(settings, store, driver, on_shutdown=store.close)
            print(f"tame serve: listening on {url} (store {store.db.dialect}, "
                  f"probes allowed to: {', '.join(settings.allowed.describe())})", flush=True)
            serve_on(app, sock)
        finally:
            store.close()
    return 0
