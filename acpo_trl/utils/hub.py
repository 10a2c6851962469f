"""Hub access checks: a push, or a model that only the Hub has, fails at once with a clear message when the Hub
cannot be reached, never after a long hang or a long run."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from huggingface_hub import constants

from .cli_errors import UserError


class HubUnreachableError(RuntimeError):
    """The Hugging Face Hub cannot be reached (offline mode, no network, or a failed upload)."""


def _connection_error(timeout: float) -> OSError | None:
    """The error of opening a TCP connection to the Hub endpoint (``HF_ENDPOINT``), or None when it opens."""
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return error
    return None


def check_hub_reachable(timeout: float = 5.0) -> None:
    """Raise ``HubUnreachableError`` unless a TCP connection to the Hub endpoint opens within ``timeout`` s.

    Honours ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` as ``huggingface_hub`` does."""
    if constants.HF_HUB_OFFLINE:
        raise HubUnreachableError(
            "push_to_hub: HF_HUB_OFFLINE is set, so nothing can be pushed. Unset it (and log in with "
            "`hf auth login`) to push, or upload the saved output_dir later."
        )
    error = _connection_error(timeout)
    if error is not None:
        raise HubUnreachableError(
            f"push_to_hub: cannot reach the Hub at {constants.ENDPOINT} ({error}). Check the network (or "
            f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', 'unset')}); the model is saved locally in output_dir and "
            "can be uploaded later with `hf upload <repo_id> <output_dir>`."
        ) from error


def check_model_source(name: str, field: str = "model_name_or_path", revision: str | None = None,
                       markers: tuple[str, ...] = ("config.json", "adapter_config.json"), timeout: float = 5.0) -> None:
    """Raise ``UserError`` unless ``name`` is a local model folder (holding one of ``markers``) or a Hub id that
    can be loaded: in the Hub cache (``markers[0]`` cached), or on a reachable Hub when ``HF_HUB_OFFLINE`` is unset.

    Transformers' own errors for these cases name neither the setting nor the fix (a missing folder becomes
    "Repo id must be in the form ..."), and an uncached id offline fails only when the model is loaded."""
    # deferred: huggingface_hub's API (0.2-0.3 s, 300 modules; its `constants` alone are light), for a model to check
    from huggingface_hub import repo_exists, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    setting = f"{field}={name!r}"
    if os.path.isdir(name):
        if not any(os.path.isfile(os.path.join(name, marker)) for marker in markers):
            raise UserError(f"{setting}: the folder has no {' or '.join(markers)}, so it holds no saved model",
                            "give the folder that save_pretrained wrote")
        return
    if os.path.exists(name):
        raise UserError(f"{setting} is a file, not a model folder", f"give the folder holding {markers[0]}")
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise UserError(f"{setting}: no such folder, and not a Hub model id",
                        "check the path, or give a Hub id such as Qwen/Qwen2.5-0.5B-Instruct") from None
    if isinstance(try_to_load_from_cache(name, markers[0], revision=revision), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise UserError(
            f"{setting}: no such local folder, and not in the Hub cache {constants.HF_HUB_CACHE} while HF_HUB_OFFLINE "
            "is set",
            f"check the path, or download the model once with network access (`hf download {name}`, same cache), "
            "or unset HF_HUB_OFFLINE",
        )
    error = _connection_error(timeout)
    if error is not None:
        raise UserError(f"{setting}: no such local folder, not in the Hub cache, and the Hub at {constants.ENDPOINT} "
                        f"cannot be reached ({error})", "check the path or the network") from error
    if not repo_exists(name):
        raise UserError(f"{setting}: no such local folder, and no such model on the Hub",
                        "check the name; for a private or gated model, log in with `hf auth login`")
