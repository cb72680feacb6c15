"""`tame serve`: the HTTP API with the store and a local probe worker (the main job).

The CLI is the composition root, so this command imports the api package (lazily, inside
`run`) although advisor/ otherwise never imports api/.
"""

from __future__ import annotations

from advisor.commands.runtime import default_driver, load_settings, open_store, setup_logging


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the HTTP advice API with its store and probe worker",
        description="Configuration comes from the environment: TAME_DATABASE_URL (default sqlite file "
                    "./tame.sqlite3 or $XDG_DATA_HOME/tame/tame.sqlite3), TAME_TOKEN, TAME_READ_TOKEN, "
                    "TAME_ALLOWED_DESTINATIONS (default loopback only), TAME_TTL_S, TAME_MAX_CONCURRENT_PROBES.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument("--no-worker", action="store_true", help="serve only; leave probes to a `tame agent`")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from api.app import create_app
    from api.server import serve

    setup_logging()
    settings = load_settings()
    store = open_store(settings)
    driver = None if args.no_worker else default_driver()
    app = create_app(settings, store, driver)
    print(f"tame serve: listening on http://{args.host}:{args.port} (store {store.db.dialect}, "
          f"probes allowed to: {', '.join(settings.allowed.describe())})", flush=True)
    try:
        serve(app, args.host, args.port)
    finally:
        store.close()
    return 0
