"""The submission server's edges: what a slow or greedy client may hold of it, bounded.

- Headers: a connection has DECODEBENCH_API_HEADER_TIMEOUT_S from its first byte (or from its opening)
  to the end of a request's headers; trickling them longer closes it. uvicorn has no such timer (its
  keep-alive timer runs only between requests), so `HeaderTimeoutH11` adds it to uvicorn's h11 protocol.
- Bodies: the app reads a request body within DECODEBENCH_API_BODY_TIMEOUT_S (`app.read_body`, 408).
- Connections: at most DECODEBENCH_API_MAX_CONNECTIONS at once (uvicorn's `limit_concurrency`: past it,
  503), and an idle keep-alive connection closes after 5 s (uvicorn's `timeout_keep_alive`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from worker.core import settings

KEEP_ALIVE_S = 5


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers (`header_timeout_s`)."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def _waiting(self) -> bool:
        """No request in progress: the next bytes are a request's headers."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self._waiting() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._waiting():
            self._arm()  # a request begins: its headers have header_timeout_s from now, however they trickle
        super().data_received(data)
        if not self._waiting():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle now: uvicorn's keep-alive timer closes the connection; new bytes arm ours again

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def uvicorn_options() -> dict[str, Any]:
    """uvicorn.run's keyword arguments for the edges above, from the settings."""
    protocol = type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout_s": settings.get("api_header_timeout_s")})
    return {
        "http": protocol,
        "limit_concurrency": settings.get("api_max_connections"),
        "timeout_keep_alive": KEEP_ALIVE_S,
    }
