"""The ``tether serve`` / ``tether demo`` flags of webhooks, and the settings they make."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._config import DEFAULT_SCHEDULE, WebhookSettings, check_secret, parse_endpoint

__all__ = ["SECRET_ENV", "webhook_options", "settings_from_options"]

#: The environment variable holding the webhook secret (never a flag: flags show in ``ps``).
SECRET_ENV = "TETHER_WEBHOOK_SECRET"


def webhook_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Add the webhook flags to a command."""
    options = [
        click.option(
            "--public-url",
            default=None,
            envvar="TETHER_PUBLIC_URL",
            help="The base URL people open the web UI at (https://tether.example.com), for the links in webhooks.",
        ),
        click.option(
            "--webhook-timeout-seconds",
            default=15.0,
            show_default=True,
            type=click.FloatRange(min=0.1),
            help="A receiver must answer 2xx within this long.",
        ),
        click.option(
            "--webhook-lease-seconds",
            default=60.0,
            show_default=True,
            type=click.FloatRange(min=1),
            help="How long a sender's claim on a delivery lasts (another process sends it after a crash).",
        ),
        click.option(
            "--webhook-retention-days",
            default=30.0,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="How long delivered and failed deliveries (and their attempts) are kept before they are purged.",
        ),
        click.option(
            "--webhook-period-seconds",
            default=86400.0,
            show_default=True,
            type=click.FloatRange(min=1),
            help="How long a failing delivery is retried before it is marked failed.",
        ),
        click.option(
            "--webhook-schedule",
            default=None,
            help="Seconds before each attempt, comma-separated (default 0,5,300,1800,7200,18000,36000,50400,72000,86400).",
        ),
        click.option("--webhook-allow-host", multiple=True, help="A host webhooks may be sent to; repeatable. Given: every other host is refused."),
        click.option(
            "--webhook-allow-private/--webhook-refuse-private",
            default=None,
            help="Whether webhooks may go to loopback and private addresses (127.0.0.1, 10.0.0.0/8, fc00::/7, …). "
            "Default: allowed with --auth open, refused with --auth keys.",
        ),
        click.option(
            "--webhook-secret-file",
            default=None,
            type=click.Path(dir_okay=False, path_type=Path),
            help=f"A file holding the webhook secret (whsec_…); else the {SECRET_ENV} environment variable.",
        ),
        click.option(
            "--webhook",
            "webhook",
            multiple=True,
            help="Send signed webhooks to URL; repeatable. URL#interrupt.created,run.failed sends only those events.",
        ),
    ]
    for option in options:
        fn = option(fn)
    return fn


def settings_from_options(options: dict[str, Any]) -> WebhookSettings | None:
    """The settings the flags describe (None without ``--webhook``); a UsageError when they are wrong."""
    urls: tuple[str, ...] = options.get("webhook") or ()
    if not urls:
        return None
    try:
        endpoints = tuple(parse_endpoint(url) for url in urls)
        path: Path | None = options.get("webhook_secret_file")
        secret = path.read_text() if path is not None else os.environ.get(SECRET_ENV, "")
        if not secret:
            raise ValueError(f"--webhook needs a secret: set {SECRET_ENV} or give --webhook-secret-file")
        schedule_text: str | None = options.get("webhook_schedule")
        schedule = tuple(float(s) for s in schedule_text.split(",")) if schedule_text else DEFAULT_SCHEDULE
        if any(s < 0 for s in schedule):
            raise ValueError("--webhook-schedule: seconds must not be negative")
        return WebhookSettings(
            endpoints=endpoints,
            secret=check_secret(secret),
            public_url=options.get("public_url"),
            schedule=schedule,
            retry_period_s=float(options.get("webhook_period_seconds") or 86400.0),
            allow_hosts=tuple(options.get("webhook_allow_host") or ()),
            allow_private_targets=options.get("webhook_allow_private"),
            lease_s=float(options.get("webhook_lease_seconds") or 60.0),
            timeout_s=float(options.get("webhook_timeout_seconds") or 15.0),
            retention_s=float(options.get("webhook_retention_days") or 30.0) * 86400.0,
        )
    except (OSError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
