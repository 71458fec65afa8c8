"""An MCP ``tools/call`` result as Tether records it: readable, bounded, JSON.

- Only text (and no ``structuredContent``): the text itself, a string.
- ``structuredContent`` beside text only (the spec asks servers to repeat it as text): the data.
- Anything else (an image, audio, an embedded resource, a resource link, or a mix): the MCP
  shape, ``{"content": [block, …], "structuredContent": …}``, with each block in the spec's own
  field names, so a client renders an image as an image and a resource as an expandable block.

A result larger than the server's ``max_result_bytes`` (as JSON) is cut: texts are shortened
and binary data dropped, and the cut says so in words (``… [cut: …]``) where people and the model
read it. An ``isError`` result raises :class:`ToolReportedError` with the server's text, so the
run records a ``tool_result`` error the model can react to.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["to_result", "ToolReportedError"]

#: Blocks whose payload is base64 (kept for people, described to the model).
_BINARY = {"image": "data", "audio": "data"}


class ToolReportedError(Exception):
    """The MCP server answered the call with ``isError: true``."""


def _block(block: Any) -> dict[str, Any]:
    """One content block as JSON, in the MCP spec's field names (``mimeType``), no ``_meta``."""
    data: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("_meta", None)
    data.pop("annotations", None)
    resource = data.get("resource")
    if isinstance(resource, dict):
        resource.pop("_meta", None)
    return data


def _text_of(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _cut_text(text: str, budget: int) -> str:
    """``text`` within ``budget`` bytes of UTF-8, with a note of what was cut."""
    encoded = text.encode()
    if len(encoded) <= budget:
        return text
    kept = encoded[: max(0, budget - 80)].decode(errors="ignore")
    return f"{kept}… [cut: {len(encoded):,} bytes of text, the first {len(kept.encode()):,} kept]"


def _bounded(blocks: list[dict[str, Any]], structured: Any, limit: int) -> tuple[list[dict[str, Any]], Any]:
    """Shorten texts and drop binary data until the result fits ``limit`` bytes of JSON."""
    if _size({"content": blocks, "structuredContent": structured}) <= limit:
        return blocks, structured
    if structured is not None and _size(structured) > limit // 2:
        text = json.dumps(structured, ensure_ascii=False)
        structured = {"cut": True, "text": _cut_text(text, limit // 2)}
    budget = max(1024, limit - _size(structured) - 512 * len(blocks))
    kept: list[dict[str, Any]] = []
    for block in blocks:
        block = dict(block)
        key = _BINARY.get(block.get("type", ""))
        if key and len(block.get(key, "")) > budget:
            size = len(block.pop(key)) * 3 // 4
            block["text"] = f"[cut: a {block.get('mimeType', block['type'])} of about {size:,} bytes, over the result limit of {limit:,}]"
        elif block.get("type") == "text":
            block["text"] = _cut_text(block["text"], budget)
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            resource = dict(block["resource"])
            if len(resource.get("blob", "")) > budget:
                resource["blob"] = ""
                resource["text"] = f"[cut: a resource over the result limit of {limit:,} bytes]"
            elif "text" in resource:
                resource["text"] = _cut_text(resource["text"], budget)
            block["resource"] = resource
        budget = max(0, budget - _size(block))
        kept.append(block)
    return kept, structured


def to_result(result: Any, max_bytes: int) -> Any:
    """The JSON Tether records for a ``CallToolResult``; raises :class:`ToolReportedError`."""
    blocks = [_block(b) for b in result.content]
    structured = result.structured_content
    if result.is_error:
        message = _text_of(blocks) or (json.dumps(structured) if structured is not None else "the tool reported an error")
        raise ToolReportedError(_cut_text(message, 4096))
    only_text = all(b.get("type") == "text" for b in blocks)
    if only_text and structured == {"result": _text_of(blocks)}:
        structured = None  # the SDKs wrap a plain string as {"result": …}: text stays text
    blocks, structured = _bounded(blocks, structured, max_bytes)
    if only_text:
        return _text_of(blocks) if structured is None else structured
    shaped: dict[str, Any] = {"content": blocks}
    if structured is not None:
        shaped["structuredContent"] = structured
    return shaped
