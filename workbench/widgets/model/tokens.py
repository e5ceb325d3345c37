"""The tokens panel's model: the prompt and every generated token, relative to a step."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...reports import Frames, tokens_frame

__all__ = ["token_strip"]


def token_strip(frames: Frames, step: int, prompt: Sequence[int] | None = None,
                decode_text: Callable[[list[int]], str] | None = None) -> dict:
    """{"items": [(token, kind)], "text": str | None}; kind is "prompt", "before" (generated
    at an earlier step), "current" (generated at `step`) or "after" (later steps)."""
    t = tokens_frame(frames)
    items = [(int(x), "prompt") for x in (prompt or [])]
    for s, tok in zip(t["step"], t["token"]):
        kind = "current" if s == step else "before" if s < step else "after"
        items.append((int(tok), kind))
    text = None
    if decode_text is not None:
        so_far = [tok for tok, kind in items if kind in ("prompt", "before", "current")]
        try:
            text = decode_text(so_far)
        except Exception as exc:  # noqa: BLE001 - a user's detokenizer must not break the view
            text = f"(decode_text failed: {exc})"
    return {"items": items, "text": text}
