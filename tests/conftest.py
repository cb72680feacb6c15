import os

import pytest


def pytest_collection_modifyitems(config, items):
    # Tests marked netns need root. In CI (CI=true, root) they must fail loudly, never skip.
    if os.geteuid() == 0 or os.environ.get("CI"):
        return
    skip = pytest.mark.skip(reason="needs root for network namespaces")
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(skip)
