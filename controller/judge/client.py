"""An OpenAI-compatible chat completions client: bounded concurrency, retries honouring Retry-After, a deadline.

`Endpoint` is where requests go (a base URL and, where one is needed, a key read from a file or an
environment variable: it is held in memory only, sent as `Authorization: Bearer …`, and never appears
in a log line, an error, a result or the report). `complete(endpoint, bodies, limits)` sends each
request body to `<url>/chat/completions`, at most `limits.concurrency` at once, and returns per body
`(text, usage_tokens)` or `(None, reason)`: a 429, a 5xx or a timeout is retried (`limits.retries`
times, exponential backoff from 1 s, or the server's Retry-After where it gives one, capped at 60 s);
a 4xx other than 429, a response that is not JSON or has no message, and any request not finished by
`limits.time_budget_s` are failures with a one-line reason. Nothing raises for one bad request.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import httpx

from worker.core.errors import UsageError

MAX_BACKOFF_S = 60.0
Reply = tuple[str | None, int | str]  # (text, tokens used) or (None, why it failed)


@dataclass(frozen=True)
class Endpoint:
    url: str
    key: str | None = field(default=None, repr=False)  # never in a repr, a log or an error

    def __repr__(self) -> str:  # a dataclass's own repr would be fine without `key`; say so explicitly
        return f"Endpoint(url={self.url!r}, key={'***' if self.key else None})"


def read_key(env: str | None, path: str | None) -> str | None:
    """An API key from the environment variable `env` or the file `path`; UsageError (naming only where) if absent."""
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise UsageError(f"judge: the environment variable {env} holding the API key is unset or empty")
        return value
    if path is not None:
        try:
            value = open(path, encoding="utf-8").read().strip()  # noqa: SIM115
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(
                f"judge: cannot read the API key file {path} ({getattr(err, 'strerror', None) or 'not UTF-8'})"
            ) from None
        if not value:
            raise UsageError(f"judge: the API key file {path} is empty")
        return value
    return None


def retry_after(header: str | None) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date; None where absent or unreadable."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _text(response: httpx.Response) -> Reply:
    try:
        doc = response.json()
        text = doc["choices"][0]["message"]["content"]
    except (json.JSONDecodeError, ValueError, KeyError, IndexError, TypeError):
        return None, f"malformed response (HTTP {response.status_code}, not a chat completion)"
    if not isinstance(text, str):
        return None, "malformed response (message content is not text)"
    usage = doc.get("usage") if isinstance(doc, dict) else None
    tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
    return text, int(tokens) if isinstance(tokens, int | float) else 0


def _one(client: httpx.Client, endpoint: Endpoint, body: dict, limits, deadline: float, sleep: Callable) -> Reply:
    headers = {"Authorization": f"Bearer {endpoint.key}"} if endpoint.key else {}
    why = "time budget spent before it was sent"
    for attempt in range(limits.retries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            return None, why if attempt == 0 else f"time budget spent after: {why}"
        wait: float | None = None
        try:
            response = client.post(
                endpoint.url.rstrip("/") + "/chat/completions",
                json=body,
                headers=headers,
                timeout=min(limits.timeout_s, left),
            )
        except httpx.TimeoutException:
            why = f"timed out after {min(limits.timeout_s, left):g} s"
        except httpx.HTTPError as err:
            why = f"connection failed ({type(err).__name__})"
        else:
            if response.status_code == 200:
                return _text(response)
            why = f"HTTP {response.status_code}"
            if response.status_code != 429 and response.status_code < 500:
                return None, why  # the request itself is wrong: retrying cannot help
            wait = retry_after(response.headers.get("retry-after"))
        if attempt < limits.retries:
            delay = min(MAX_BACKOFF_S, wait if wait is not None else 2.0**attempt)
            if time.monotonic() + delay >= deadline:
                return None, f"{why}; the time budget ends before the retry"
            sleep(delay)
    return None, f"{why} after {limits.retries + 1} tries"


def each_reply(
    endpoint: Endpoint, bodies: list[dict], limits, *, sleep: Callable = time.sleep, deadline_at: float | None = None
) -> Iterator[tuple[int, Reply]]:
    """(index, reply) for each body as it is answered (see the module's docstring); `limits` is the spec's
    JudgeLimits; `deadline_at` (epoch seconds, sooner than the budget): the report's deadline, where it started
    earlier."""
    deadline = time.monotonic() + limits.time_budget_s
    if deadline_at is not None:
        deadline = min(deadline, time.monotonic() + deadline_at - time.time())
    with httpx.Client() as client, ThreadPoolExecutor(max_workers=limits.concurrency) as pool:
        sent = {pool.submit(_one, client, endpoint, b, limits, deadline, sleep): i for i, b in enumerate(bodies)}
        for done in as_completed(sent):
            yield sent[done], done.result()


def complete(endpoint: Endpoint, bodies: list[dict], limits, **options) -> list[Reply]:
    """Each body's reply, in order (`each_reply`'s, collected)."""
    out: list[Reply] = [(None, "not sent")] * len(bodies)
    for i, reply in each_reply(endpoint, bodies, limits, **options):
        out[i] = reply
    return out
