"""A webhook receiver for ``benchmarks/webhooks.py``: uvicorn on ``--port``, answers every
``POST /hook`` with 204 after verifying its Standard Webhooks signature, and notes the arrival
time (``time.time()``) of the first delivery of each ``webhook-id`` with its event type.

``GET /stats`` answers ``{"deliveries": {id: [type, arrived_at]}, "repeats": n, "bad": n}``;
``POST /reset`` forgets everything. The secret comes from ``TETHER_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import uvicorn
from standardwebhooks import Webhook

VERIFIER = Webhook(os.environ["TETHER_WEBHOOK_SECRET"])
SEEN: dict[str, tuple[str, float]] = {}
COUNTS = {"repeats": 0, "bad": 0}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    arrived = time.time()
    status, answer = 204, b""
    if scope["method"] == "POST" and scope["path"] == "/hook":
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        try:
            VERIFIER.verify(body, headers)
        except Exception:
            COUNTS["bad"] += 1
        webhook_id = headers.get("webhook-id", "")
        if webhook_id in SEEN:
            COUNTS["repeats"] += 1
        else:
            SEEN[webhook_id] = (json.loads(body).get("type", "?"), arrived)
    elif scope["path"] == "/stats":
        status, answer = 200, json.dumps({"deliveries": SEEN, **COUNTS}).encode()
    elif scope["path"] == "/healthz":
        status, answer = 200, b"{}"
    elif scope["path"] == "/reset":
        SEEN.clear()
        COUNTS.update(repeats=0, bad=0)
    else:
        status = 404
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": answer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off", access_log=False)


if __name__ == "__main__":
    main()
