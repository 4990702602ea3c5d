"""The ``openai`` engine: any OpenAI-compatible server (vLLM serve, SGLang, llama.cpp, hosted APIs).

``generate`` posts the context as a list of token ids to ``/completions`` and asks for the sampled
tokens back as ids (vLLM's ``return_tokens_as_token_ids``, parsed from ``"token_id:123"`` tokens),
so rollouts stay token-exact. For servers that only return text, the text is tokenised with the
configured tokenizer and the output is marked ``metadata["retokenized"] = True``: those ids may differ
from what the model sampled and carry no logprobs. ``chat`` uses ``/chat/completions`` and is meant for
frozen sub-models, LLM judges and evaluation.

Weights of a remote server cannot be pushed from here, so ``update_weights`` raises
:class:`WeightSyncUnsupportedError` instead of silently leaving a trainer's policy stale.

``httpx`` is imported on first use, not with this module, so listing components stays fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams, StopReason
from skyrl_core.engines.retry import Backoff, is_retryable_status, parse_retry_after

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"
MAX_SERVER_MESSAGE_CHARS = 500
STOP_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length"}


class OpenAIEngineConfig(BaseModel):
    """Options of the ``openai`` engine (section ``engine`` of a run config)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field("http://127.0.0.1:8000/v1",
                          description="Server root including the API version, e.g. what `vllm serve` prints.")
    model: str | None = Field(None, description="Served model name; None uses the first model listed at /models.")
    api_key: SecretStr | None = Field(None, description="Bearer token; None reads the env var named by api_key_env.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Env var holding the API key when api_key is unset.")
    tokenizer: str | None = Field(
        None, description="HF name or local path of the served model's tokenizer, loaded lazily with transformers; "
                          "needed only for servers that return text without token ids.")
    timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for connecting and for each read of an "
                                                       "attempt (a non-streamed completion arrives in one read).")
    max_retries: int = Field(3, ge=0, description="Extra attempts after connection errors, timeouts, 429 and 5xx.")
    backoff_base_s: float = Field(0.5, ge=0, description="First retry delay in seconds; doubles per retry, jittered.")
    backoff_max_s: float = Field(30.0, ge=0, description="Longest wait between attempts, including a Retry-After.")
    max_concurrency: int = Field(64, ge=1, description="Requests in flight at once from this engine.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers for every request.")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="Extra JSON fields for every request (server-specific options).")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://127.0.0.1:8000/v1")
        return value.rstrip("/")


class OpenAIEngineError(EngineError):
    """A request to an OpenAI-compatible server failed; the message names the URL and the cause."""

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status

    def after_attempts(self, attempts: int) -> OpenAIEngineError:
        """The same error, saying how many attempts were made."""
        if attempts == 1:
            return self
        error = type(self)(f"{self} (gave up after {attempts} attempts)", url=self.url, status=self.status)
        error.__cause__ = self.__cause__
        return error


class OpenAIStatusError(OpenAIEngineError):
    """The server answered with an HTTP error status; ``status`` holds it."""


class OpenAITimeoutError(OpenAIEngineError):
    """No complete answer within ``timeout_s``."""


class WeightSyncUnsupportedError(EngineError, NotImplementedError):
    """The engine cannot load new weights (it talks to a server it does not control)."""


class OpenAIEngine:
    """Async client for an OpenAI-compatible server, implementing :class:`skyrl_core.engine.InferenceEngine`.

    Safe to call concurrently; at most ``max_concurrency`` requests are in flight. Use one engine per
    event loop at a time; ``aclose()`` (or ``async with``) releases its connections.
    """

    def __init__(self, config: OpenAIEngineConfig | Mapping[str, Any] | None = None, *,
                 tokenizer: Any | None = None) -> None:
        if not isinstance(config, OpenAIEngineConfig):
            from skyrl_core.factory import validate_config

            config = validate_config(OpenAIEngineConfig, config or {}, "engine")  # type: ignore[assignment]
        self.config: OpenAIEngineConfig = config  # type: ignore[assignment]
        self._tokenizer = tokenizer
        self._model = self.config.model
        self._api_key = _resolve_api_key(self.config)
        self._backoff = Backoff(self.config.backoff_base_s, self.config.backoff_max_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"OpenAIEngine(base_url={self.config.base_url!r}, model={self._model!r})"

    @property
    def tokenizer(self) -> Any | None:
        """The tokenizer passed in, else ``config.tokenizer`` loaded with transformers; ``None`` if neither."""
        if self._tokenizer is None and self.config.tokenizer:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise EngineError("engine.tokenizer needs transformers: pip install transformers") from exc
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer)
            except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
                raise EngineError(f"cannot load engine.tokenizer {self.config.tokenizer!r}: {exc}") from exc
        return self._tokenizer

    async def model_name(self) -> str:
        """``config.model``, or the first model the server lists at ``/models``."""
        if self._model is None:
            payload = await self._request("GET", "/models")
            try:
                self._model = str(payload["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise OpenAIEngineError(f"{self._url('/models')} lists no models; set engine.model",
                                        url=self._url("/models")) from None
        return self._model

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        """Continue ``prompt_ids`` via ``/completions``; at most ``params.max_tokens`` ids come back."""
        body = {
            "model": await self.model_name(), "prompt": [int(i) for i in prompt_ids],
            **sampling_fields(params), "logprobs": 1, "return_tokens_as_token_ids": True,
            **self.config.extra_body,
        }
        payload = await self._request("POST", "/completions", body)
        return completion_output(first_choice(payload, self._url("/completions")), params.max_tokens,
                                 self.tokenizer, self._url("/completions"))

    async def chat(self, messages: Sequence[Mapping[str, str]], **sampling: Any) -> str:
        """The assistant's reply text from ``/chat/completions``.

        ``sampling`` holds request fields such as ``temperature`` or ``max_tokens`` (``model``
        overrides the configured one).
        """
        model = sampling.pop("model", None) or await self.model_name()
        body = {"model": model, **self.config.extra_body, **sampling, "messages": [dict(m) for m in messages]}
        url = self._url("/chat/completions")
        choice = first_choice(await self._request("POST", "/chat/completions", body), url)
        message = choice.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, str):
            raise OpenAIEngineError(f"{url} returned no message text (finish_reason "
                                    f"{choice.get('finish_reason')!r})", url=url)
        return content

    async def update_weights(self, named_tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        raise WeightSyncUnsupportedError(
            "the openai engine talks to a server whose weights cannot be pushed from here; use it for frozen "
            "sub-models, judges and evaluation, and the hf or vllm engine for the policy being trained")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        self._client = self._loop = self._semaphore = None

    async def __aenter__(self) -> OpenAIEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _url(self, path: str) -> str:
        return self.config.base_url + path

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """Client and concurrency limit bound to the running event loop (remade if the loop changed)."""
        import httpx

        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._semaphore is None:
            headers = dict(self.config.headers)
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            self._client = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.config.timeout_s),
                limits=httpx.Limits(max_connections=self.config.max_concurrency))
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    async def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """Send one request with retries; return the decoded JSON body or raise an OpenAIEngineError."""
        import httpx

        client, semaphore = self._session()
        url = self._url(path)
        attempts = self.config.max_retries + 1
        async with semaphore:  # held through backoff sleeps, so a struggling server sees fewer requests
            for attempt in range(attempts):
                retry_after = None
                try:
                    response = await client.request(method, url, json=body)
                except httpx.TimeoutException as exc:
                    failure: OpenAIEngineError = OpenAITimeoutError(
                        f"{method} {url} timed out after {self.config.timeout_s:g} s (engine.timeout_s)", url=url)
                    failure.__cause__ = exc
                except httpx.TransportError as exc:
                    failure = OpenAIEngineError(
                        f"cannot reach {method} {url}: {self._redact(str(exc)) or type(exc).__name__} "
                        f"(is the server running at engine.base_url?)", url=url)
                    failure.__cause__ = exc
                else:
                    if response.status_code < 400:
                        return self._decode(response, url)
                    failure = self._status_error(method, url, response)
                    if not is_retryable_status(response.status_code):
                        raise failure
                    retry_after = parse_retry_after(response.headers.get("retry-after"))
                if attempt + 1 < attempts:
                    delay = self._backoff.delay(attempt, retry_after)
                    log.warning("%s; retry %d/%d in %.2f s", failure, attempt + 1, attempts - 1, delay)
                    await asyncio.sleep(delay)
        raise failure.after_attempts(attempts)

    def _decode(self, response: httpx.Response, url: str) -> Any:
        try:
            return response.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            snippet = self._redact(response.text[:200])
            raise OpenAIEngineError(f"{url} answered HTTP {response.status_code} with a body that is not valid "
                                    f"JSON: {snippet!r}", url=url, status=response.status_code) from None

    def _status_error(self, method: str, url: str, response: httpx.Response) -> OpenAIStatusError:
        status = response.status_code
        message = self._redact(server_message(response.text))
        hint = ""
        if status in (401, 403):
            hint = f" (check engine.api_key or the {self.config.api_key_env} env var)"
        elif status == 404:
            hint = " (check engine.base_url, which usually ends in /v1, and engine.model)"
        return OpenAIStatusError(f"HTTP {status} {response.reason_phrase} from {method} {url}: {message}{hint}",
                                 url=url, status=status)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text


def _resolve_api_key(config: OpenAIEngineConfig) -> str | None:
    if config.api_key is not None:
        return config.api_key.get_secret_value() or None
    return os.environ.get(config.api_key_env) or None


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """Request fields for ``params``; vLLM extensions are sent only when they change something."""
    body: dict[str, Any] = {"max_tokens": params.max_tokens, "temperature": params.temperature,
                            "top_p": params.top_p}
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.stop:
        body["stop"] = list(params.stop)
        body["include_stop_str_in_output"] = True
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def server_message(body: str) -> str:
    """The human-readable error from an error body (OpenAI, FastAPI or plain text), truncated."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    message: Any = body
    if isinstance(data, Mapping):
        error = data.get("error", data)
        if isinstance(error, Mapping):
            message = error.get("message") or error.get("detail") or json.dumps(error)
        else:
            message = error
    text = str(message).strip() or "(empty body)"
    if len(text) > MAX_SERVER_MESSAGE_CHARS:
        text = text[:MAX_SERVER_MESSAGE_CHARS] + f"... [{len(text) - MAX_SERVER_MESSAGE_CHARS} more chars]"
    return text


def first_choice(payload: Any, url: str) -> Mapping[str, Any]:
    choices = payload.get("choices") if isinstance(payload, Mapping) else None
    if not choices or not isinstance(choices[0], Mapping):
        keys = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
        raise OpenAIEngineError(f"{url} returned no choices (response keys: {keys})", url=url)
    return choices[0]


def completion_output(choice: Mapping[str, Any], max_tokens: int, tokenizer: Any | None,
                      url: str) -> GenerateOutput:
    """Token ids, logprobs and stop reason of one completions choice, cut to ``max_tokens``."""
    text = choice.get("text")
    text = text if isinstance(text, str) else ""
    finish_reason = choice.get("finish_reason")
    metadata: dict[str, Any] = {"finish_reason": finish_reason, "retokenized": False}
    ids, logprobs = sampled_tokens(choice.get("logprobs"), url)
    if ids is None:
        if tokenizer is None:
            raise OpenAIEngineError(
                f"{url} returned text without token ids (the server does not support vLLM's "
                "return_tokens_as_token_ids); set engine.tokenizer so the text can be tokenised", url=url)
        ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
        logprobs = None
        metadata["retokenized"] = True
    stop_reason = STOP_REASONS.get(finish_reason, "abort")
    if len(ids) > max_tokens:
        ids, stop_reason, text = ids[:max_tokens], "length", None
        logprobs = logprobs[:max_tokens] if logprobs is not None else None
    return GenerateOutput(ids, logprobs, stop_reason, text, metadata)


def sampled_tokens(logprobs: Any, url: str) -> tuple[list[int] | None, list[float] | None]:
    """Ids and logprobs from ``"token_id:N"`` tokens; ``(None, None)`` when the server sent no ids."""
    tokens = logprobs.get("tokens") if isinstance(logprobs, Mapping) else None
    if not isinstance(tokens, list) or not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX)
                                               for t in tokens):
        return None, None
    try:
        ids = [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
    except ValueError:
        raise OpenAIEngineError(f"{url} returned a malformed token id among {tokens[:8]!r}", url=url) from None
    values = logprobs.get("token_logprobs")
    if (isinstance(values, list) and len(values) == len(ids)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
        return ids, [float(v) for v in values]
    return ids, None
