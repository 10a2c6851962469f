"""Hub access checks: pushing without a network fails at once with a clear message, never after a long hang."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse


class HubUnreachableError(RuntimeError):
    """The Hugging Face Hub cannot be reached (offline mode, no network, or a failed upload)."""


def check_hub_reachable(timeout: float = 5.0) -> None:
    """Raise ``HubUnreachableError`` unless a TCP connection to the Hub endpoint opens within ``timeout`` s.

    Honours ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` as ``huggingface_hub`` does."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise HubUnreachableError(
            "push_to_hub: HF_HUB_OFFLINE is set, so nothing can be pushed. Unset it (and log in with "
            "`hf auth login`) to push, or upload the saved output_dir later."
        )
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        raise HubUnreachableError(
            f"push_to_hub: cannot reach the Hub at {constants.ENDPOINT} ({error}). Check the network (or "
            f"HF_ENDPOINT={os.environ.get('HF_ENDPOINT', 'unset')}); the model is saved locally in output_dir and "
            "can be uploaded later with `hf upload <repo_id> <output_dir>`."
        ) from error
