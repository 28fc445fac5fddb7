"""``--push-to-hub REPO``: upload a saved model folder to the Hugging Face hub with ``huggingface_hub``.

The hub is the one ``huggingface_hub`` is configured for (``HF_ENDPOINT``, ``HF_TOKEN`` or ``hf auth login``), so a
private hub or a local stand-in works the same way.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HubPushError", "push_folder", "visibility_line"]


class HubPushError(RuntimeError):
    """The upload failed; the message names the repo, the folder (kept on disk) and what to check."""


def push_folder(folder: str | Path, repo_id: str, message: str, private: bool | None = None) -> tuple[str, bool | None]:
    """Create ``repo_id`` (a model repo; kept, with its visibility, if it exists) and upload ``folder`` as one commit;
    returns (its URL, whether the repo is private: as the hub reports it after the upload, None if it does not say).

    ``private``: True creates a private repo (TRL's ``hub_private_repo``); None leaves it to the hub's default.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=message, repo_type="model")
        is_private = _visibility(api, repo_id)
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
    return str(url), is_private


def _visibility(api: object, repo_id: str) -> bool | None:
    """Whether ``repo_id`` is private, as the hub says (an existing repo keeps its own visibility); None when the
    hub does not answer (the upload itself succeeded)."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        private = api.model_info(repo_id).private  # type: ignore[attr-defined]
    except (HfHubHTTPError, OSError, ValueError):
        return None
    return None if private is None else bool(private)


def visibility_line(repo_id: str, private: bool | None, asked_private: bool) -> str:
    """What the user must know about who can read the upload, in one clause."""
    if private:
        return f"{repo_id} is a private repository"
    if private is None:
        return f"the hub did not say whether {repo_id} is private; check its settings page"
    why = " (it existed and kept its visibility)" if asked_private else "; --hub-private-repo creates a private one"
    return f"{repo_id} is a PUBLIC repository: anyone can download it{why}"
