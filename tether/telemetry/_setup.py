"""Where a process's spans go: the standard ``OTEL_*`` environment variables decide.

Tracing is on when the process is told where to send spans, and only then is the
OpenTelemetry SDK imported (the ``otel`` extra):

- ``OTEL_TRACES_EXPORTER`` names exporters (``otlp``, ``console``; ``none`` turns tracing off), or
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (then ``otlp``);
- ``OTEL_SDK_DISABLED=true`` turns it off whatever else is set.

The OTLP exporter is OTLP/HTTP with protobuf, and reads its own variables (endpoint, headers,
timeout, compression); the batch processor reads ``OTEL_BSP_*``, the resource
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name`` defaults to
``tether``). An application that embeds Tether and set up its own SDK tracer provider keeps it:
Tether's spans then go wherever that one sends them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["tracer_provider_from_environment", "configured_exporters"]

log = logging.getLogger("tether.telemetry")


def configured_exporters(env: Mapping[str, str]) -> list[str]:
    """The trace exporters the environment asks for (empty: tracing off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = env.get("OTEL_TRACES_EXPORTER")
    if named is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in named.split(",") if n.strip()]
    return [] if "none" in names else names


def tracer_provider_from_environment(env: Mapping[str, str] | None = None) -> TracerProvider | None:
    """The tracer provider this process's spans go to, or None when nothing asks for spans.

    The first is an SDK provider an embedding application set globally; else one built here
    from the environment (the caller shuts it down).
    """
    env = os.environ if env is None else env
    if "opentelemetry.sdk.trace" in sys.modules:  # someone loaded the SDK: maybe set a provider
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider

        provider = trace.get_tracer_provider()
        if isinstance(provider, SdkProvider):
            return provider
    exporters = configured_exporters(env)
    if not exporters:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError as exc:
        raise RuntimeError("OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed: pip install 'tether[otel]'") from exc
    named_service = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named_service else {"service.name": "tether"}))
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
            if protocol != "http/protobuf":
                log.warning("OTLP protocol %r is not supported; spans are sent with http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER %r ignored (supported: otlp, console, none)", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
