"""When and how long to wait before retrying an HTTP request: exponential backoff with jitter, and
which request fields a strict server's 4xx answer asks to leave out."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES = frozenset({408, 409, 429})
FIELD_REJECTION_STATUSES = frozenset({400, 422})
# How servers say a field is not allowed: FastAPI/pydantic "Extra inputs are not permitted",
# transformers serve "Unexpected fields in the request: {...}", OpenAI "Unrecognized request argument".
_FIELD_REJECTION = re.compile(r"unexpected|unknown|unrecognized|unsupported|extra (?:inputs|fields)|not permitted|"
                              r"not allowed|not supported", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_retryable_status(status: int) -> bool:
    """Rate limits, request timeouts, conflicts and server errors are worth another try."""
    return status in RETRYABLE_STATUSES or status >= 500


def rejected_fields(status: int | None, message: str, fields: Iterable[str]) -> set[str]:
    """The ``fields`` of a request that a 400/422 ``message`` names as unexpected, unknown or unsupported.

    Empty when the status or the wording is about something else, so only answers that name the
    offending fields lead to a retry without them.
    """
    if status not in FIELD_REJECTION_STATUSES or not _FIELD_REJECTION.search(message):
        return set()
    return set(_WORD.findall(message)) & set(fields)


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
