"""The tokens panel's model: the prompt and every generated token, relative to a step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...reports import Frames, tokens_frame

__all__ = ["SYNTHETIC_IDS", "is_builtin_model", "piece_of", "token_strip"]

#: what a built-in model's token ids are (they have no text)
SYNTHETIC_IDS = ("synthetic ids: a built-in model is a tiny decoder with random weights and no vocabulary, "
                 "so its ids have no text (give tokenizer= for a real model's)")


def piece_of(tokenizer: Any, token: int) -> str | None:
    """The text of one token id, as the tokenizer decodes it alone (None when unknown)."""
    if tokenizer is None:
        return None
    try:
        return str(tokenizer.decode([int(token)]))
    except Exception:  # noqa: BLE001 - a user's tokenizer must not break the view
        return None


def is_builtin_model(session: Any) -> bool:
    """Whether `session` runs one of `workbench.models`' random tiny decoders."""
    proto = getattr(session, "model_proto", None)
    return getattr(proto, "producer_name", "") == "workbench.models"


def token_strip(frames: Frames, step: int, prompt: Sequence[int] | None = None,
                decode_text: Callable[[list[int]], str] | None = None, tokenizer: Any = None) -> dict:
    """{"items": [(token, kind)], "pieces": [text | None], "text": str | None}; kind is
    "prompt", "before" (generated at an earlier step), "current" (generated at `step`) or
    "after" (later steps). `pieces` is each token's own text when a `tokenizer` (anything
    with `decode(ids)`) is known; `text` the text of the tokens so far (`decode_text`,
    else the tokenizer's decode)."""
    t = tokens_frame(frames)
    items = [(int(x), "prompt") for x in (prompt or [])]
    for s, tok in zip(t["step"], t["token"]):
        kind = "current" if s == step else "before" if s < step else "after"
        items.append((int(tok), kind))
    if decode_text is None and tokenizer is not None:
        decode_text = tokenizer.decode
    text = None
    if decode_text is not None:
        so_far = [tok for tok, kind in items if kind in ("prompt", "before", "current")]
        try:
            text = decode_text(so_far)
        except Exception as exc:  # noqa: BLE001 - a user's detokenizer must not break the view
            text = f"(decode_text failed: {exc})"
    return {"items": items, "pieces": [piece_of(tokenizer, tok) for tok, _ in items], "text": text}
