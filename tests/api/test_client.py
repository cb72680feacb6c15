"""The client's service URL: check_url takes http(s)://HOST[:PORT] only, and no message shows the URL's password."""

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from api.client import InvalidServiceURL, TameClient, TameError, check_url, shown_url

# Every password below is s3cr3tPW, written as is, percent-encoded or cut by a raw /: none of its pieces may be shown.
SECRET_PIECES = ("s3cr", "tPW")


@contextmanager
def _served(handler: type) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering with ``handler`` (a BaseHTTPRequestHandler) in a thread: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url, shown", [
    ("http://tame:s3cr3tPW@db:8000/prefix", "http://***@db:8000/prefix"),
    ("http://u:s3cr%33tPW@h", "http://***@h"),
    ("http://:s3cr3tPW@h", "http://***@h"),
    # A login alone may be the secret (was shown: http://s3cr3tPW@127.0.0.1:1).
    ("http://s3cr3tPW@127.0.0.1:1", "http://***@127.0.0.1:1"),
    ("https://s3cr3tPW@h:8443/", "https://***@h:8443/"),
    # A password holding a raw @, / or ? is hidden whole, up to the last @.
    ("http://u:s3cr@3tPW@h/", "http://***@h/"),
    ("http://u:s3cr/3tPW@h", "http://***@h"),
    ("http://u:s3cr?3tPW@h", "http://***@h"),
    # Without "scheme://" (a value httpx reads as scheme u, or as a path) the user part starts the text.
    ("u:s3cr3tPW@h:8000", "***@h:8000"),
    ("http:/u:s3cr3tPW@h", "***@h"),
    ("//u:s3cr3tPW@h", "***@h"),
    # A query's values are hidden, its keys kept (was shown: ?token=s3cr3tPW).
    ("http://h:8000/?token=s3cr3tPW", "http://h:8000/?token=***"),
    ("http://h/?a=1&token=s3cr3tPW&s3cr3tPW&b=", "http://h/?a=***&token=***&***&b="),
    ("u:s3cr3tPW@h/?next=http://x", "***@h/?next=***"),
    # Nothing to hide: no user part, no query, a port.
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://h:8443/prefix/", "http://h:8443/prefix/"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_shown_url_shows_the_user_part_and_query_values_as_stars(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://tame.example/", "http://[::1]:8000/",
                                 "HTTP://Tame.Example:80"])
def test_check_url_takes_http_and_https_with_a_host(url):
    check_url(url)


@pytest.mark.parametrize("url, why", [
    ("http://u:s3cr3tPW@[::1", "is not a valid URL"),
    ("http://u:s3cr/3tPW@h", "is not a valid URL"),  # httpx reads "s3cr" as a port, and says so
    ("http://u:s3cr\n3tPW@h", "is not a valid URL"),
    ("ftp://u:s3cr3tPW@h/", "is not an http or https URL"),
    ("u:s3cr3tPW@h:8000", "is not an http or https URL"),
    ("localhost:8000", "is not an http or https URL"),
    ("127.0.0.1:8000", "is not an http or https URL"),
    (" http://h", "is not an http or https URL"),
    ("", "is not an http or https URL"),
    ("http://u:s3cr%33tPW@", "has no host"),
    ("http:///v1", "has no host"),
    ("http://:8000", "has no host"),
    ("http://h:99999", "has a port outside 1-65535"),
    # The socket layer's idna codec refuses these names with a UnicodeError: was a traceback at the first request.
    ("http://" + "a" * 64 + ":8000", "has a host name with an empty label or one over 63 characters"),
    ("http://a..b:8000", "has a host name with an empty label or one over 63 characters"),
    ("http://.a:8000", "has a host name with an empty label or one over 63 characters"),
    ("http://u:s3cr3tPW@xn--zz:8000", "is not a valid URL"),  # was idna.IDNAError from httpx.URL, a traceback
    ("http://tame:s3cr3tPW@h:8000/prefix", "holds a login, and the service takes none"),
    ("https://tame@h", "holds a login, and the service takes none"),
])
def test_check_url_refuses_what_is_not_a_service_address(url, why):
    with pytest.raises(InvalidServiceURL) as raised:
        check_url(url, "TAME_URL")
    message = str(raised.value)
    assert message.startswith(f"TAME_URL={shown_url(url)!r} {why}")
    assert message.endswith(": give the advice service's address as http://HOST:PORT (or https://HOST:PORT)")
    # Nor in a chained exception (httpx's message repeats pieces of the URL), which a traceback would print.
    assert raised.value.__cause__ is None and raised.value.__context__ is None
    for piece in SECRET_PIECES:
        assert piece not in message


def test_check_url_names_a_flag_as_written_on_the_command_line():
    with pytest.raises(InvalidServiceURL, match=r"^--server 'ftp://\*\*\*@h' is not an http or https URL: "):
        check_url("ftp://u:s3cr3tPW@h", "--server")


def test_the_client_refuses_a_bad_url_and_shows_a_good_one_without_its_password():
    with pytest.raises(InvalidServiceURL, match=r"^base_url='ftp://\*\*\*@h' "):
        TameClient("ftp://u:s3cr3tPW@h")
    with pytest.raises(InvalidServiceURL, match=r"^base_url='http://\*\*\*@127.0.0.1:1' holds a login"):
        TameClient("http://u:s3cr3tPW@127.0.0.1:1")
    # Port 1 on loopback refuses at once.
    with TameClient("http://127.0.0.1:1", timeout_s=5) as client:
        assert client.shown_url == "http://127.0.0.1:1"
        with pytest.raises(TameError) as raised:
            client.paths()
    assert raised.value.status == 0 and "cannot reach the advice service" in str(raised.value)


@pytest.fixture
def login_page():
    """A real HTTP server on 127.0.0.1 that answers every request 200 with an HTML page, as a proxy's or a captive
    portal's login page does, or 302 to it for /redirect...: yields its URL."""
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", "/login")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"<html><body>Please log in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    with _served(Page) as url:
        yield url


@pytest.mark.parametrize("prefix", ["", "/redirect"])
def test_an_answer_that_is_not_json_is_a_tame_error_to_try_again_naming_what_came(login_page, prefix):
    # Was a bare ValueError (JSONDecodeError) out of every client call: a traceback in the CLI, and a site agent's
    # probe thread took it for a failed probe.
    with TameClient(login_page + prefix) as client:
        with pytest.raises(TameError) as got:
            client.paths()
    assert got.value.retryable
    assert "answered HTTP" in str(got.value) and "not JSON" in str(got.value) and "TAME_URL" in str(got.value)
    assert ("'text/html'" in str(got.value)) == (prefix == "")


def test_the_cli_says_the_service_answered_a_page_not_json_and_exits_nonzero(login_page):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TAME_")}, "TAME_URL": login_page}
    done = subprocess.run([sys.executable, "-m", "advisor", "paths"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "not JSON: check that it is the service's address (TAME_URL)" in done.stderr, done.stderr


@pytest.fixture
def answering():
    """A real HTTP server on 127.0.0.1 answering each request with the status and JSON text its path gives,
    /STATUS/TEXT (percent-encoded), as a proxy or a wrong service might: yields its URL."""
    import urllib.parse

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):
            _, status, text = self.path.split("?")[0].split("/", 2)
            body = urllib.parse.unquote(text.split("/")[0]).encode()
            if body == b"huge":  # a proxy's error page of a megabyte, with a terminal escape in it
                body = b"<html>\x1b]0;owned\x07\x1b[2J" + b"x" * 1_000_000 + b"</html>"
            self.send_response(int(status))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PUT = do_GET

        def log_message(self, *args):
            pass

    with _served(Answer) as url:
        yield url


@pytest.mark.parametrize("status, text", [
    (502, '["bad gateway"]'), (503, '"down for maintenance"'), (500, "null"), (404, "42"),  # a refusal's
    (200, "null"), (200, "[]"), (200, '"ok"'), (201, "1.5"), (200, "true"),  # an answer's
])
def test_json_that_is_no_object_is_a_tame_error_naming_what_came_not_a_traceback(answering, status, text):
    # JSON that is not an object (a proxy's, another service's) was returned as the answer, which every caller reads
    # as an object (a TypeError in the agent's loop), or, refused, raised AttributeError ('list' object has no
    # attribute 'get') out of the client.
    import urllib.parse

    with TameClient(f"{answering}/{status}/{urllib.parse.quote(text)}") as client:
        with pytest.raises(TameError) as got:
            client.probe("x")
    if status >= 400:
        assert got.value.status == status and text.strip('"') in str(got.value), str(got.value)
    else:
        assert got.value.status == 0 and got.value.retryable
        assert f"answered HTTP {status}" in str(got.value) and "not a JSON object" in str(got.value), str(got.value)


def test_a_refusal_that_is_not_the_service_s_shows_a_line_of_its_text_not_all_of_it(answering):
    # A proxy's 502 page was the TameError's whole message: a megabyte, terminal escapes and all, printed by the CLI
    # and by tame agent every round.
    with TameClient(f"{answering}/502/huge") as client:
        with pytest.raises(TameError) as got:
            client.probe("x")
    shown = str(got.value)
    assert got.value.status == 502 and shown.startswith("HTTP 502: <html>"), shown[:200]
    assert len(shown) < 1000 and "<html>" in shown and "\x1b" not in shown and "\x07" not in shown, shown[:200]


@pytest.fixture
def answering_empty_object():
    """A real HTTP server on 127.0.0.1 that answers every request 200 with ``{}`` (a service of another version, or
    another service): yields (its URL, the paths it was asked for, as sent)."""
    asked = []

    class Empty(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    with _served(Empty) as url:
        yield url, asked


def test_an_answer_without_the_field_a_call_reads_is_a_tame_error_naming_it(answering_empty_object):
    # Was a KeyError out of paths(), batch() and tame agent's links()["site"], a traceback where every other bad
    # answer is a TameError.
    url, _ = answering_empty_object
    with TameClient(url) as client:
        for call, field in ((client.paths, "paths"), (lambda: client.batch([("127.0.0.1:5201", 0.1)]), "results"),
                            (client.own_site, "site")):
            with pytest.raises(TameError) as got:
                call()
            assert f"without {field!r}" in str(got.value) and got.value.retryable
        assert client.probe("abc") == {}


def test_a_probe_id_is_sent_as_one_path_segment(answering_empty_object):
    # Was put in the path as given: '../paths' asked GET /v1/paths, 'a?b' sent a query.
    url, asked = answering_empty_object
    with TameClient(url) as client:
        for probe_id in ("../paths", "a?b", "a/b", "a#b"):
            client.probe(probe_id)
    assert asked == ["/v1/probes/..%2Fpaths", "/v1/probes/a%3Fb", "/v1/probes/a%2Fb", "/v1/probes/a%23b"]
