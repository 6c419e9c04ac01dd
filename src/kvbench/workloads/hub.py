"""The Hugging Face hub, asked once before a download: a hub id kvbench cannot fetch (the machine
is offline, no such repository) fails at once in one line naming the id and the fix, instead of
after ~30 s of retries logged line by line."""

from __future__ import annotations

# Seconds the hub has to answer whether a repository exists.
PROBE_TIMEOUT_S = 10.0
# The fix for a trace named by a hub dataset id that cannot be fetched.
LOCAL_TRACE_FIX = "expected a local trace file (workload.path=FILE)"
HUB_TRACE_FIX = f"{LOCAL_TRACE_FIX}, or HF_HUB_OFFLINE=1 to read the Hugging Face cache's copy"


class HubUnavailableError(OSError):
    """A hub id that cannot be fetched; the message is one line naming the id and the fix."""


def hub_is_offline() -> bool:
    """Whether the user switched the hub off (``HF_HUB_OFFLINE=1``): only cached copies load."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def offline_error(hub_id: str, what: str, fix: str) -> HubUnavailableError:
    """The error for ``hub_id`` when the hub is switched off and its cache has no copy."""
    return HubUnavailableError(f"{what} {hub_id}: not a local path, and the Hugging Face hub is "
                               f"switched off (HF_HUB_OFFLINE=1) with no cached copy; {fix}")


def check_hub_id(hub_id: str, repo_type: str, what: str, fix: str) -> None:
    """Raise :class:`HubUnavailableError` unless the hub can serve ``hub_id``.

    Args:
        hub_id: ``owner/name`` (or a bare ``name``) of a hub repository.
        repo_type: ``model`` or ``dataset``.
        what: what kvbench wanted it as, e.g. ``tokenizer`` (starts the message).
        fix: what to set instead, e.g. ``expected a local folder (workload.tokenizer=DIR)``.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(hub_id)
    except HFValidationError:
        raise HubUnavailableError(f"{what} {hub_id}: no such local path, nor a hub id "
                                  f"owner/name; {fix}") from None
    if hub_is_offline():
        raise offline_error(hub_id, what, fix)
    try:
        HfApi().repo_info(hub_id, repo_type=repo_type, timeout=PROBE_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise HubUnavailableError(f"{what} {hub_id}: not a local path, nor a {repo_type} on the "
                                  f"Hugging Face hub; {fix}") from None
    except HfHubHTTPError:
        return  # the hub answered (a gated repo, a rate limit): the download says what it needs
    except Exception as error:  # offline: DNS, refused, timeout, proxy, whatever the client raises
        raise HubUnavailableError(
            f"{what} {hub_id}: not a local path, and the Hugging Face hub cannot be reached "
            f"({type(error).__name__}: {' '.join(str(error).split())}); {fix}"
        ) from None
