"""The CLI's side of the submission server: `decodebench submit|status|... --api URL`.

The token comes from DECODEBENCH_TOKEN_FILE (or DECODEBENCH_TOKEN) and is sent only as the
`Authorization` header; it is never printed or logged. A transient failure (the server or
Redis restarting, a busy quota lock, the rate limit) is retried with backoff: every request
is idempotent (a submit of the same sweep enqueues only what is missing). What the server
refuses (4xx) is one line and exit 2; what fails on its side or on the way, exit 1. An https://
server's certificate is always verified (DECODEBENCH_CA_BUNDLE names a private CA); one that does
not verify is one line, exit 2, without retries.
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

from controller.server.errors import RequestRefused, ServerUnavailable
from worker.core import settings
from worker.core.errors import UsageError

TRANSIENT = (502, 503, 504)
MAX_WAIT_S = 30.0


def load_token(token: str | None = None, token_file: str | None = None) -> str:
    """The bearer token: `token` (DECODEBENCH_TOKEN) or the first line of `token_file` (DECODEBENCH_TOKEN_FILE)."""
    token = token if token is not None else settings.get("token")
    token_file = token_file if token_file is not None else settings.get("token_file")
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            why = getattr(err, "strerror", None) or type(err).__name__
            raise UsageError(f"DECODEBENCH_TOKEN_FILE {token_file}: cannot read the token ({why})") from None
    if not token:
        raise UsageError(
            "no token for the submission server: set DECODEBENCH_TOKEN_FILE to the file your admin gave you"
        )
    if any(c.isspace() for c in token) or not token.isprintable():
        raise UsageError("the token holds spaces or control characters: check DECODEBENCH_TOKEN(_FILE)")
    return token


def check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")) or len(url) > 2048:
        raise UsageError(f"--api {url[:80]!r}: give the server's http:// or https:// URL")
    return url.rstrip("/")


def tls_context() -> ssl.SSLContext:
    """Certificates are always verified: against DECODEBENCH_CA_BUNDLE when set, else the system's CAs."""
    ca = settings.get("ca_bundle")
    try:
        return ssl.create_default_context(cafile=ca or None)
    except (OSError, ssl.SSLError) as err:
        why = getattr(err, "strerror", None) or "not a PEM CA bundle"
        raise UsageError(f"DECODEBENCH_CA_BUNDLE={ca}: cannot read it ({why})") from None


class ApiClient:
    """A few retries with exponential backoff (or the server's Retry-After) around each request."""

    def __init__(self, url: str, token: str, *, retries: int | None = None, timeout: float = 120.0) -> None:
        import httpx

        self.url = check_url(url)
        self.retries = settings.get("api_retries") if retries is None else retries
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            follow_redirects=False,
            verify=tls_context(),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        import httpx

        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError as err:
                if "CERTIFICATE_VERIFY_FAILED" in str(err):  # no retry: it fails the same way again
                    raise UsageError(
                        f"{self.url}: the server's certificate did not verify ({_why(err)}); "
                        "set DECODEBENCH_CA_BUNDLE to the CA that signed it"
                    ) from None
                if last:
                    raise ServerUnavailable(f"cannot reach the submission server at {self.url} ({_why(err)})") from None
                time.sleep(_backoff(attempt))
                continue
            retry_after = response.headers.get("retry-after")
            if (response.status_code in TRANSIENT or retry_after) and not last:
                time.sleep(_wait(retry_after, attempt))
                continue
            return _result(response)
        raise AssertionError("unreachable")  # pragma: no cover


def _why(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else type(err).__name__


def _backoff(attempt: int) -> float:
    return min(MAX_WAIT_S, 0.5 * 2**attempt)


def _wait(retry_after: str | None, attempt: int) -> float:
    try:
        return min(MAX_WAIT_S, max(0.0, float(retry_after))) if retry_after else _backoff(attempt)
    except ValueError:
        return _backoff(attempt)


def _reason(response) -> str:
    try:
        data = response.json()
        reason = data.get("error") if isinstance(data, dict) else None
    except ValueError:
        reason = None
    text = str(reason or response.text or response.reason_phrase).strip().splitlines()
    return (text[0] if text else "")[:500]


def _result(response) -> Any:
    if response.status_code >= 500:
        raise ServerUnavailable(f"HTTP {response.status_code} from the submission server: {_reason(response)}")
    if response.status_code >= 400:
        raise RequestRefused(f"HTTP {response.status_code}: {_reason(response)}")
    try:
        return response.json()
    except ValueError:
        raise ServerUnavailable(f"the submission server answered HTTP {response.status_code} without JSON") from None


def submission(spec, priority: str, retry_failed: bool, retries: int | None = None) -> dict:
    """The body of POST /v1/sweeps: the validated spec with its prompts inline (same sweep id as a direct submit)."""
    from controller.sweep.prompts import load_prompts

    prompts = load_prompts(spec.prompts)
    data = spec.model_dump(mode="json")
    data["prompts"] = {
        "inline": [p.model_dump(mode="json") for p in prompts],
        "shard_size": spec.prompts.shard_size,
    }
    base = str(spec.base_dir) if spec.base_dir else None
    return {"spec": data, "base_dir": base, "priority": priority, "retry_failed": retry_failed, "retries": retries}


def connect(api: str) -> ApiClient:
    return ApiClient(api, load_token())
