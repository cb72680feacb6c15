"""/docs, /redoc and /openapi.json: behind the read token when one is set, and served with no CDN."""

import re

READ = {"Authorization": "Bearer r3ad"}


def test_the_docs_need_the_read_token_when_one_is_set(service_factory):
    base, client, app = service_factory(token="s3cret", read_token="r3ad", start_worker=False)
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers=READ).status_code == 200, path


def test_the_docs_load_their_assets_from_this_server(service_factory):
    base, client, app = service_factory(start_worker=False)
    for path, kinds in (("/docs", {"javascript", "css"}), ("/redoc", {"javascript"})):
        html = client.get(path).text
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
        urls += re.findall(r"""url:\s*["']([^"']+)["']""", html)
        assert urls, html
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), f"{path} loads {url}"
        served = set()
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, url
            served.update(kind for kind in ("javascript", "css", "json", "png")
                          if kind in response.headers["content-type"])
        assert kinds <= served, (path, served)
