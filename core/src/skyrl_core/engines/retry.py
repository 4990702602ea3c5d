"""When and how long to wait before retrying an HTTP request: exponential backoff with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    """Rate limits, request timeouts, conflicts and server errors are worth another try."""
    return status in RETRYABLE_STATUSES or status >= 500


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); ``None`` if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


@dataclass(frozen=True)
class Backoff:
    """Delay before retry number ``attempt`` (0-based): ``base * 2**attempt`` with jitter, capped at ``max_s``.

    The jitter draws from the upper half of the exponential step so concurrent clients that failed
    together spread out without ever retrying immediately. A server's ``Retry-After`` replaces the
    computed delay (still capped at ``max_s`` so one header cannot stall a run indefinitely).
    """

    base_s: float
    max_s: float

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_s)
        step = min(self.max_s, self.base_s * 2 ** attempt)
        return step * random.uniform(0.5, 1.0)
