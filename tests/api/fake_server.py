"""`python -m tests.api.fake_server PORT`: the real app and store under uvicorn, probing with the fake driver.

For tests that must kill the server process; settings come from the environment as for
`tame serve`, plus FAKE_DELAY_S (seconds each fake probe takes).
"""

import os
import sys

from advisor.settings import Settings
from advisor.store import Store
from api.app import create_app
from api.server import serve
from probes.fake import FakeDriver
from tests.api.conftest import rate

if __name__ == "__main__":
    settings = Settings.from_env()
    store = Store.open(settings.database_url)
    app = create_app(settings, store, FakeDriver(rate, rtt_s=0.01, delay_s=float(os.environ.get("FAKE_DELAY_S", "0"))))
    serve(app, "127.0.0.1", int(sys.argv[1]))
