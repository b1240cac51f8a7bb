"""The small HTTP service the ``outside`` source's network tasks call (``tasks-api:8080``).

Standard library only, deterministic: ``python -m rollstream.tasks.service [--port 8080]`` (compose
runs it as the service ``tasks-api``; the tests run this file's source in a container of their own).
A shop's catalogue as JSON:

* ``GET /items`` -> ``{"items": ["apple", ...]}``
* ``GET /items/<name>`` -> ``{"name", "price", "stock"}`` (404 ``{"error"}`` for an unknown item)
* ``GET /orders?page=N`` -> ``{"orders": [{"item", "quantity"}, ...], "next": N + 1 or null}`` (three pages)
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOST = "tasks-api"
PORT = 8080
CATALOGUE = {
    "apple": {"price": 0.5, "stock": 120},
    "bread": {"price": 2.25, "stock": 30},
    "cheese": {"price": 7.8, "stock": 12},
    "dates": {"price": 4.1, "stock": 0},
    "eggs": {"price": 3.05, "stock": 48},
}
ORDERS = [
    [{"item": "apple", "quantity": 10}, {"item": "bread", "quantity": 2}],
    [{"item": "cheese", "quantity": 1}, {"item": "apple", "quantity": 5}, {"item": "eggs", "quantity": 12}],
    [{"item": "bread", "quantity": 1}],
]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["items"]:
            return self.reply(200, {"items": sorted(CATALOGUE)})
        if len(parts) == 2 and parts[0] == "items":
            item = CATALOGUE.get(parts[1])
            if item is None:
                return self.reply(404, {"error": f"no item {parts[1]!r}"})
            return self.reply(200, {"name": parts[1], **item})
        if parts == ["orders"]:
            page = parse_qs(url.query).get("page", ["0"])[0]
            if not page.isdigit() or int(page) >= len(ORDERS):
                return self.reply(404, {"error": f"no page {page!r}"})
            n = int(page)
            return self.reply(200, {"orders": ORDERS[n], "next": n + 1 if n + 1 < len(ORDERS) else None})
        return self.reply(404, {"error": "unknown path"})

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    ThreadingHTTPServer(("0.0.0.0", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
