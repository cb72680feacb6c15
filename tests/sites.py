"""The site the tests run as: tests/conftest.py sets TAME_SITE to it, so a service's own site (and the source
of every link a test stores through the service) is this, whatever the host is called."""

SITE = "test-site"
