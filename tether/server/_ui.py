"""The web UI: one server-rendered page at ``GET /`` and the static files it loads.

The page is a plain HTML shell; ``static/app.js`` (an ES module, no build step) drives it with
``static/tether-client.js``, the browser client any other front end can use on its own. Static
URLs carry a digest of the files so a new version is never served from a stale cache; the
import map does the same for the modules ``app.js`` imports.
"""

from __future__ import annotations

import hashlib
import html
import json
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from .. import __version__

__all__ = ["STATIC_DIR", "install_ui", "render_index"]

#: Where the UI's files live (shipped as package data).
STATIC_DIR = Path(__file__).parent / "static"

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def _static_version() -> str:
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(STATIC_DIR.glob("*")):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _asset(name: str) -> str:
    return f"/static/{name}?v={_static_version()}"


def render_index() -> str:
    """The HTML of the page at ``/``."""
    # Modules import each other by plain relative URLs; the import map adds the version.
    modules = sorted(path.name for path in STATIC_DIR.glob("*.js"))
    import_map = json.dumps({"imports": {f"/static/{name}": _asset(name) for name in modules}})
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tether</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{html.escape(_asset("app.css"))}">
<script type="importmap">{import_map}</script>
<script type="module" src="{html.escape(_asset("app.js"))}"></script>
</head>
<body data-version="{html.escape(__version__)}">
<a class="skip" href="#input">Skip to the message box</a>
<header class="topbar">
  <button type="button" id="toggle-threads" class="icon-btn" aria-controls="sidebar" aria-expanded="false">☰<span class="sr-only"> Threads</span></button>
  <h1 class="brand">Tether</h1>
  <span id="thread-title" class="thread-title"></span>
  <button type="button" id="rename-btn" class="btn small" aria-label="Rename thread" hidden><span aria-hidden="true">✎</span><span class="wide-only"> Rename</span></button>
  <button type="button" id="allowances-btn" class="btn small chip" aria-haspopup="dialog" hidden></button>
  <button type="button" id="audit-btn" class="btn small" disabled>Audit log</button>
  <span id="conn" class="conn" role="status" aria-live="polite" data-state="idle">ready</span>
</header>
<div class="layout">
  <nav id="sidebar" class="sidebar" aria-label="Threads">
    <button type="button" id="new-thread" class="btn primary wide">+ New thread</button>
    <button type="button" id="approvals-btn" class="btn wide approvals-btn" hidden>Approvals <span id="approvals-count" class="count"></span></button>
    <div class="account"><span id="who" class="who" hidden></span><button type="button" id="sign-out" class="btn small" hidden>Sign out</button></div>
    <ul id="thread-list" class="thread-list"></ul>
  </nav>
  <div id="scrim" class="scrim" hidden></div>
  <main id="main" class="main">
    <div id="chat" class="chat" role="log" aria-label="Conversation">
      <p class="empty">Start a conversation below. Try <q>refund 25 on order A100</q>, <q>long</q>, or <q>ask what colour</q>.</p>
    </div>
    <div id="status-line" class="status-line" role="status" aria-live="polite" hidden></div>
    <div id="banner" class="banner" role="alert" hidden></div>
    <form id="composer" class="composer" autocomplete="off">
      <label for="input" class="sr-only">Message</label>
      <textarea id="input" rows="2" aria-describedby="composer-hint" placeholder="Message the agent… (Enter to send, Shift+Enter for a new line)"></textarea>
      <p id="composer-hint" class="composer-hint" role="status" aria-live="polite"></p>
      <div class="composer-row">
        <details id="settings" class="settings">
          <summary>Run settings</summary>
          <label>Approval needed from
            <select id="set-threshold">
              <option value="destructive">destructive tools</option>
              <option value="reversible">reversible tools too</option>
            </select>
          </label>
          <label>Approval window (s)
            <input id="set-ttl" type="number" min="1" step="1" inputmode="numeric" placeholder="tool default">
          </label>
        </details>
        <span class="spacer"></span>
        <button type="button" id="stop" class="btn danger" hidden title="Stop the run (Esc). Click again to stop at once.">Stop</button>
        <button type="button" id="stop-now" class="btn danger outline" hidden title="Stop at once, cancelling a running tool">Stop now</button>
        <button type="submit" id="send" class="btn primary">Send</button>
      </div>
    </form>
  </main>
</div>
<dialog id="audit" class="audit" aria-labelledby="audit-title">
  <div class="audit-head"><h2 id="audit-title">Audit log</h2>
  <button type="button" id="audit-close" class="btn small">Close</button></div>
  <div id="audit-body"></div>
</dialog>
<dialog id="timeline" class="audit timeline" aria-labelledby="timeline-title" aria-describedby="timeline-summary">
  <div class="audit-head"><h2 id="timeline-title">Run timeline</h2>
  <span class="panel-actions"><button type="button" id="timeline-refresh" class="btn small" hidden>Refresh</button>
  <button type="button" id="timeline-close" class="btn small">Close</button></span></div>
  <div id="timeline-body"></div>
</dialog>
<dialog id="approvals" class="audit" aria-labelledby="approvals-title">
  <div class="audit-head"><h2 id="approvals-title">Approvals</h2>
  <button type="button" id="approvals-close" class="btn small">Close</button></div>
  <div id="approvals-list" class="approvals"></div>
  <div class="approvals-bar">
    <label for="approvals-reason">Reason (for a reject)</label>
    <input id="approvals-reason" type="text" maxlength="4000" autocomplete="off">
    <button type="button" id="approvals-approve" class="btn primary" disabled>Approve selected</button>
    <button type="button" id="approvals-allow" class="btn allow" disabled aria-expanded="false" aria-controls="approvals-allow-panel">Approve and allow…</button>
    <button type="button" id="approvals-reject" class="btn danger" disabled>Reject selected</button>
  </div>
  <div id="approvals-allow-panel" class="approvals-allow" hidden></div>
  <p id="approvals-status" class="approvals-status" role="status" aria-live="polite"></p>
</dialog>
<dialog id="allowances" class="audit allowances" aria-labelledby="allowances-title" aria-describedby="allowances-about">
  <div class="audit-head"><h2 id="allowances-title">Standing approvals</h2>
  <button type="button" id="allowances-close" class="btn small">Close</button></div>
  <p id="allowances-about" class="hint">Calls these cover run without asking, until they end or are revoked. Everything else is still asked.</p>
  <div id="allowances-body"></div>
  <p id="allowances-status" class="approvals-status" role="status" aria-live="polite"></p>
</dialog>
<dialog id="rename" class="audit signin rename" aria-labelledby="rename-title">
  <form id="rename-form" novalidate>
    <h2 id="rename-title">Rename thread</h2>
    <label for="rename-input">Title</label>
    <input id="rename-input" type="text" maxlength="200" autocomplete="off" spellcheck="true" aria-describedby="rename-error">
    <p id="rename-error" class="card-error" role="alert"></p>
    <div class="panel-actions">
      <button type="submit" id="rename-save" class="btn primary">Save</button>
      <button type="button" id="rename-cancel" class="btn">Cancel</button>
    </div>
  </form>
</dialog>
<dialog id="signin" class="audit signin" aria-labelledby="signin-title">
  <form id="signin-form" method="dialog">
    <h2 id="signin-title">Sign in</h2>
    <p>This server needs an API key (<code>tether keys create</code> makes one).</p>
    <label for="signin-key">API key</label>
    <input id="signin-key" type="password" autocomplete="off" spellcheck="false" required placeholder="tk_…">
    <label class="check"><input id="signin-remember" type="checkbox"> Remember me on this browser</label>
    <p id="signin-error" class="card-error" role="alert"></p>
    <button type="submit" class="btn primary">Sign in</button>
  </form>
</dialog>
<noscript><p class="banner">The Tether UI needs JavaScript. The API is documented at <a href="/docs">/docs</a>.</p></noscript>
</body>
</html>
"""


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    """The web UI."""
    return HTMLResponse(render_index(), headers={"Cache-Control": "no-cache"})


def install_ui(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files at ``/static``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
