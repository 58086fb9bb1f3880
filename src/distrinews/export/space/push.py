"""``--push-to-hub REPO_ID``: create the Docker Space (if it is new) and upload the bundle with huggingface_hub.

Needs a token with write access (``hf auth login``, or ``HF_TOKEN``) and a network. Large
files go through the Hub's own upload protocol, so git and Git LFS are not needed here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...config import ConfigError

# Never uploaded: a git repository the user made in the folder, a local torch wheel, byte code.
IGNORE = [".git/*", ".whl/*", "**/__pycache__/*"]


class PushError(RuntimeError):
    """The upload failed (network, permissions, the Hub); the folder itself is complete."""


def push_to_hub(
    folder: str | os.PathLike[str], repo_id: str, private: bool = False, commit_message: str = "DistriNews Space"
) -> str:
    """Upload ``folder`` to the Space ``repo_id``; returns the Space's page."""
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"--push-to-hub {repo_id!r}: want OWNER/NAME, e.g. your-user/distrinews")
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError("--push-to-hub needs huggingface_hub: pip install 'distrinews[hub]'") from None
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ConfigError("--push-to-hub: HF_HUB_OFFLINE=1 is set; unset it where the Hub is reachable")
    if not (token := huggingface_hub.get_token()):
        raise ConfigError(
            "--push-to-hub needs a Hugging Face token with write access: run `hf auth login`, or set HF_TOKEN"
        )
    api = huggingface_hub.HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="space", space_sdk="docker", exist_ok=True, private=private)
        api.upload_folder(
            repo_id=repo_id,
            repo_type="space",
            folder_path=str(Path(folder)),
            commit_message=commit_message,
            ignore_patterns=IGNORE,
        )
    except Exception as exc:  # network, 401/403, a name taken by a non-Docker Space: the same advice
        first = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise PushError(
            f"could not push {folder} to the Space {repo_id} ({type(exc).__name__}: {first}); "
            "the folder is complete: push it with git as its README.md says"
        ) from None
    return f"https://huggingface.co/spaces/{repo_id}"
