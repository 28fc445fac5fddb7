"""``--push-to-hub REPO``: upload a saved model folder to the Hugging Face hub with ``huggingface_hub``.

The hub is the one ``huggingface_hub`` is configured for (``HF_ENDPOINT``, ``HF_TOKEN`` or ``hf auth login``), so a
private hub or a local stand-in works the same way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HubPushError", "push_folder"]


class HubPushError(RuntimeError):
    """The upload failed; the message names the repo, the folder (kept on disk) and what to check."""


def push_folder(folder: str | Path, repo_id: str, message: str, private: bool | None = None) -> str:
    """Create ``repo_id`` (a model repo; kept if it exists) and upload ``folder`` as one commit; returns its URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=message, repo_type="model")
    except OfflineModeIsEnabled:
        raise HubPushError(
            f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set, so nothing was uploaded; the model is in {folder}. "
            f"Upload it later with: hf upload {repo_id} {folder}"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise HubPushError(
            f"--push-to-hub {repo_id}: upload failed ({type(e).__name__}: {first}); the model is kept in {folder}. "
            f"Check the repo id and your token (hf auth login), then: hf upload {repo_id} {folder}"
        ) from None
    return str(url)
