"""A GGUF file's own tokenizer, rebuilt with the `tokenizers` package.

    tok = GGUFTokenizer.from_gguf("model.gguf")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])   # token ids
    text = tok.decode(ids, skip_special_tokens=True)

llama.cpp's "gpt2" tokenizer model is byte-level BPE: the vocabulary
(`tokenizer.ggml.tokens`), merges (`tokenizer.ggml.merges`), token types
(control / user-defined tokens are matched whole in the text) and the special ids
come from the file; the pre-tokenizer follows `tokenizer.ggml.pre` (the regexes of
llama.cpp's `llama-vocab.cpp` for that name). The chat template
(`tokenizer.chat_template`) is rendered with jinja2's immutable sandbox: it comes
from a file and is never trusted with more than string formatting.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from workbench.errors import ModelLoadError, WorkbenchError

from .gguf import GGUFFile, read_gguf

#: llama.cpp token types (llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: tokenizer.ggml.pre -> how llama.cpp splits text before BPE
#:   "gpt2":   the GPT-2 regex
#:   "digits": every digit alone, then the GPT-2 regex (llama.cpp's \p{N} + GPT-2 pair)
#:   "llama3" / "qwen2": one regex, then bytes
PRE_TOKENIZERS = {
    "gpt2": "gpt2",
    "mpt": "gpt2",
    "olmo": "gpt2",
    "jais": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "command-r": "digits",
    "codeshell": "digits",
    "exaone": "digits",
    "minerva-7b": "digits",
    "llama-bpe": "llama3",
    "llama3": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
}
#: pre-tokenizers whose llama.cpp vocab sets ignore_merges (a whole word in the vocab wins)
IGNORE_MERGES = {"llama3"}


TOKENIZER_FILE = "tokenizer.json"
SETTINGS_FILE = "tokenizer_settings.json"


class TokenizerError(WorkbenchError):
    """A tokenizer was misused (e.g. a chat template is missing or fails to render)."""


def _require_tokenizers():
    try:
        import tokenizers  # noqa: PLC0415
    except ImportError:
        raise ModelLoadError("building a GGUF tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
    return tokenizers


def _pre_tokenizer(kind: str, tokenizers):
    pre = tokenizers.pre_tokenizers
    if kind == "gpt2":
        return pre.ByteLevel(add_prefix_space=False, use_regex=True)
    if kind == "digits":
        return pre.Sequence([pre.Digits(individual_digits=True), pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = {"llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}[kind]
    return pre.Sequence([
        pre.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
        pre.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


class GGUFTokenizer:
    """encode / decode / apply_chat_template over a GGUF file's byte-level BPE vocabulary."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
        pre: str = "",
    ):
        #: the underlying `tokenizers.Tokenizer`
        self.tokenizer = tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.chat_template = chat_template
        #: the file's `tokenizer.ggml.pre`
        self.pre = pre

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_gguf(cls, source: str | os.PathLike | GGUFFile) -> GGUFTokenizer:
        f = source if isinstance(source, GGUFFile) else read_gguf(source)
        tokenizers = _require_tokenizers()
        model = f.get("tokenizer.ggml.model", None)
        if model != "gpt2":
            raise ModelLoadError(
                f"GGUF tokenizer model {model!r} in {f.path.name!r} is not supported "
                "(supported: 'gpt2', byte-level BPE)"
            )
        pre_name = str(f.get("tokenizer.ggml.pre", "default"))
        kind = PRE_TOKENIZERS.get(pre_name)
        if kind is None:
            raise ModelLoadError(
                f"GGUF pre-tokenizer {pre_name!r} in {f.path.name!r} is not supported "
                f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
            )
        tokens = f.get("tokenizer.ggml.tokens")
        merges_text = f.get("tokenizer.ggml.merges", [])
        types = f.get("tokenizer.ggml.token_type", None) or [TOKEN_NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise ModelLoadError(
                f"GGUF tokenizer in {f.path.name!r}: {len(types)} token types for {len(tokens)} tokens"
            )
        vocab: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            vocab.setdefault(tok, i)  # the first id wins, as in llama.cpp's token_to_id
        merges = []
        for m in merges_text:
            left, sep, right = m.partition(" ")
            if not sep:
                raise ModelLoadError(f"GGUF tokenizer in {f.path.name!r}: merge {m!r} is not 'left right'")
            merges.append((left, right))

        def special_id(key: str) -> int | None:
            value = f.get(f"tokenizer.ggml.{key}", None)
            return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

        unk = special_id("unknown_token_id")
        options = {"ignore_merges": True} if kind in IGNORE_MERGES else {}
        bpe = tokenizers.models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk] if unk is not None else None,
            fuse_unk=False,
            byte_fallback=False,
            **options,
        )
        tk = tokenizers.Tokenizer(bpe)
        tk.pre_tokenizer = _pre_tokenizer(kind, tokenizers)
        tk.decoder = tokenizers.decoders.ByteLevel()
        # control and user-defined tokens are matched whole in the text (llama.cpp's
        # parse_special); control ones are dropped by skip_special_tokens
        added = [
            tokenizers.AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
            for i in range(len(tokens))
            if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and tokens[i]
        ]
        if added:
            tk.add_tokens(added)
        bos, eos = special_id("bos_token_id"), special_id("eos_token_id")
        add_bos = bool(f.get("tokenizer.ggml.add_bos_token", False))
        add_eos = bool(f.get("tokenizer.ggml.add_eos_token", False))
        if (add_bos and bos is not None) or (add_eos and eos is not None):
            pieces, specials = [], []
            if add_bos and bos is not None:
                pieces.append(tokens[bos])
                specials.append((tokens[bos], bos))
            pieces.append("$A")
            if add_eos and eos is not None:
                pieces.append(tokens[eos])
                specials.append((tokens[eos], eos))
            tk.post_processor = tokenizers.processors.TemplateProcessing(
                single=" ".join(pieces), special_tokens=list(dict.fromkeys(specials))
            )
        return cls(
            tk,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=special_id("padding_token_id"),
            unk_token_id=unk,
            add_bos_token=add_bos,
            add_eos_token=add_eos,
            chat_template=f.get("tokenizer.chat_template", None),
            pre=pre_name,
        )

    # -- persistence ------------------------------------------------------------
    _SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "add_bos_token",
                 "add_eos_token", "chat_template", "pre")

    def save(self, folder: str | os.PathLike) -> Path:
        """Write `tokenizer.json` (the `tokenizers` format) and `tokenizer_settings.json`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(folder / TOKENIZER_FILE))
        settings = {name: getattr(self, name) for name in self._SETTINGS}
        (folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=1, sort_keys=True))
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike) -> GGUFTokenizer:
        """A tokenizer written by `save` (ModelLoadError if it is missing or unreadable)."""
        tokenizers = _require_tokenizers()
        folder = Path(folder)
        try:
            tk = tokenizers.Tokenizer.from_file(str(folder / TOKENIZER_FILE))
            settings = json.loads((folder / SETTINGS_FILE).read_text())
        except Exception as e:  # OSError, ValueError, tokenizers' own Exception
            raise ModelLoadError(f"cannot load a saved tokenizer from {str(folder)!r}: {e}") from None
        return cls(tk, **{k: settings.get(k) for k in cls._SETTINGS if k in settings})

    # -- use --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(int(token_id))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds BOS/EOS when the file asks for them."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra) -> str:
        """The chat template applied to `messages`, as text (sandboxed jinja2)."""
        if not self.chat_template:
            raise TokenizerError("this GGUF file has no tokenizer.chat_template")
        template = _compile_template(self.chat_template)

        def token(i):
            return self.id_to_token(i) if i is not None else ""

        try:
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=token(self.bos_token_id),
                eos_token=token(self.eos_token_id),
                **extra,
            )
        except Exception as e:  # jinja2's TemplateError, SecurityError, raise_exception(...)
            raise TokenizerError(f"the chat template failed to render: {type(e).__name__}: {e}") from None

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tokenize: bool = True, **extra
    ) -> list[int] | str:
        """As transformers does: the rendered chat as token ids (or text with tokenize=False).

        Special tokens come from the template's text itself (no BOS/EOS is added).
        """
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **extra)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def stream(self, skip_special_tokens: bool = True) -> TextStream:
        """An incremental decoder: `.step(token_id)` returns the newly finished text."""
        return TextStream(self, skip_special_tokens)


class TextStream:
    """Decodes a growing token list and hands out only the new, complete characters."""

    def __init__(self, tokenizer: GGUFTokenizer, skip_special_tokens: bool = True):
        self._tok, self._skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.text = ""

    def step(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self._tok.decode(self.ids, skip_special_tokens=self._skip)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        new, self.text = text[len(self.text):], text
        return new


_TEMPLATES: dict[str, Any] = {}


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: plain JSON (jinja2's own escapes <, >, & and ' for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str):
    template = _TEMPLATES.get(source)
    if template is not None:
        return template
    try:
        from jinja2 import TemplateError  # noqa: PLC0415
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
    except ImportError:
        raise TokenizerError("rendering a chat template needs the 'jinja2' package (pip install jinja2)") from None

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        template = env.from_string(source)
    except TemplateError as e:
        raise TokenizerError(f"the chat template does not compile: {e}") from None
    _TEMPLATES[source] = template
    return template
