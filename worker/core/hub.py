"""Where a model comes from, and why it cannot be had: named, with the fix.

`unavailable_reason(err)` reads an exception chain (transformers wraps the hub's errors in an
`OSError`) and names the cause (the hub unreachable, a gated repo, a repo or revision not found,
not in the local cache while offline) with its fix, or returns None for any other error. The
engine uses it where a model or tokenizer fails to load; `resolve(path, revision)` uses it to
check a model before any job runs (`decodebench validate --check-models`, `decodebench run`),
without loading weights: a local directory needs its config.json, a hub id its config.json in
the local cache or from the hub.

huggingface_hub is imported inside the functions and its errors are recognised by class name,
so this module stays light (worker.core imports nothing heavy).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from worker.core.errors import ModelUnavailableError

FIX_UNREACHABLE = (
    "download it once where the hub is reachable and run with HF_HUB_OFFLINE=1, or give the model as a local path"
)
FIX_OFFLINE = "download it once where the hub is reachable (without HF_HUB_OFFLINE), or give a local path"
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_UNREACHABLE = {
    "LocalEntryNotFoundError",  # the hub could not be asked and the cache has no copy
    "ConnectError",
    "ConnectTimeout",
    "ReadTimeout",
    "TimeoutException",
    "ConnectionError",
    "gaierror",
    "TimeoutError",
}


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def unavailable_reason(err: BaseException) -> str | None:
    """The cause and the fix of a hub failure anywhere in `err`'s chain; None for any other error."""
    for e in _chain(err):
        names = {c.__name__ for c in type(e).__mro__}
        if "GatedRepoError" in names:
            return (
                "a gated repo on the hub: accept its terms on its hub page, then log in (`hf auth login`, or HF_TOKEN)"
            )
        if "RevisionNotFoundError" in names:
            return "that revision does not exist on the hub: check the model's `revision`"
        if "RepositoryNotFoundError" in names:
            return (
                "not found on the hub (a typo? a private repo needs `hf auth login` or HF_TOKEN; "
                "a local directory must exist)"
            )
        if "OfflineModeIsEnabled" in names or (offline() and "LocalEntryNotFoundError" in names):
            return f"not in the local cache and HF_HUB_OFFLINE=1: {FIX_OFFLINE}"
        if names & _UNREACHABLE:
            return f"the hub ({endpoint()}) is unreachable and the model is not in the local cache: {FIX_UNREACHABLE}"
    return None


def hub_reachable(timeout: float = 3.0) -> bool | None:
    """Whether a TCP connection to the hub's host opens within `timeout`; None behind a proxy (unknown).

    One connection instead of the hub client's five retries with back-off (about 25 s)."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None
    url = urlsplit(endpoint())
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def is_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or Path(path).is_dir()


def resolve(path: str, revision: str | None = None, *, reachable: bool | None = None) -> str:
    """How the model will be found ("a local directory", "in the local cache", "on the hub"), without
    loading weights; `ModelUnavailableError` with the cause and the fix if it will not be.

    `reachable`: the answer of `hub_reachable()` when already known (False: the hub is not asked)."""
    if is_local(path):
        local = Path(path).expanduser()
        if not (local / "config.json").is_file():
            what = "no config.json in it" if local.is_dir() else "the local directory does not exist"
            raise ModelUnavailableError(what, path)
        return "a local directory"
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:  # the controller image without the worker extra
        return "a hub id (not checked: huggingface_hub is not installed here)"
    cached = try_to_load_from_cache(path, "config.json", revision=revision)
    if offline() or reachable is False:
        if isinstance(cached, str):
            return "in the local cache" + ("" if offline() else " (the hub is unreachable: set HF_HUB_OFFLINE=1)")
        if offline():
            raise ModelUnavailableError(f"not in the local cache and HF_HUB_OFFLINE=1: {FIX_OFFLINE}", path)
        raise ModelUnavailableError(
            f"the hub ({endpoint()}) is unreachable and the model is not in the local cache: {FIX_UNREACHABLE}", path
        )
    try:
        hf_hub_download(path, "config.json", revision=revision)
    except Exception as err:  # the hub's errors, named below; anything else is not a hub problem
        reason = unavailable_reason(err)
        if "EntryNotFoundError" in {c.__name__ for c in type(err).__mro__} and reason is None:
            reason = "the hub repo has no config.json: not a transformers model"
        if reason is None:
            raise
        raise ModelUnavailableError(reason, path) from None
    return "on the hub"
