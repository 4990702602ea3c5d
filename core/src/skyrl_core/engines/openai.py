"""The ``openai`` engine: any OpenAI-compatible server (vLLM serve, SGLang, llama.cpp, hosted APIs).

Two modes (``engine.mode``):

* ``completions`` (default): ``generate`` posts the context as a list of token ids to ``/completions``
  and asks for the sampled tokens back as ids (vLLM's ``return_tokens_as_token_ids``, parsed from
  ``"token_id:123"`` tokens), so rollouts stay token-exact (``metadata["token_source"] == "exact"``).
  Strict servers that reject such vendor fields are learnt from: when a 400/422 answer names fields of
  the request as unexpected/unknown, the request is sent again without them and they are left out of
  every later request to that endpoint; a server that takes only text prompts gets the decoded
  context. Text answers are tokenised with the configured tokenizer and marked
  ``metadata["token_source"] == "retokenized"`` (and ``metadata["retokenized"] = True``): those ids
  may differ from what the model sampled and carry no logprobs.
* ``chat``: no tokenizer at all. The engine's ``tokenizer`` is a :class:`ChatTextCodec` whose "ids"
  are characters plus three markers, so the generator's context decodes back to the chat messages;
  ``generate`` sends them to ``/chat/completions`` and returns the reply text. Outputs are marked
  ``metadata["token_source"] == "text"``: the trajectories are for evaluation, and trainers refuse
  them. Generator budgets (``max_tokens_per_turn``, ``max_context_length``) count characters here.

``chat`` (the method) uses ``/chat/completions`` in either mode and is meant for frozen sub-models,
LLM judges and evaluation.

``preflight()`` checks the server before any episode (``skyrl eval`` and ``skyrl rollout`` call it):
one ``GET /models`` without retries, so an unreachable server or a refused key is one error naming the URL.

Weights of a remote server cannot be pushed from here, so ``update_weights`` raises
:class:`WeightSyncUnsupportedError` instead of silently leaving a trainer's policy stale.

``httpx`` is imported on first use, not with this module, so listing components stays fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from skyrl_core.engine import EngineError, GenerateOutput, SamplingParams, StopReason
from skyrl_core.engines.retry import Backoff, is_retryable_status, parse_retry_after, rejected_fields

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"
MAX_SERVER_MESSAGE_CHARS = 500
STOP_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length"}
# Fields a request cannot do without; a server that names one of these as unexpected is not retried.
REQUIRED_FIELDS = frozenset({"model", "prompt", "messages"})
# The longest wait of the server check before episodes (an unreachable host should not take minutes).
PREFLIGHT_TIMEOUT_S = 30.0
# How a server that takes only text prompts answers a prompt of token ids ("prompt must be a string").
PROMPT_MUST_BE_TEXT = re.compile(r"\bprompt\b.*\b(?:str|string|text)\b", re.IGNORECASE | re.DOTALL)


class OpenAIEngineConfig(BaseModel):
    """Options of the ``openai`` engine (section ``engine`` of a run config)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["completions", "chat"] = Field(
        "completions", description="completions: token ids in and out via /completions (trainable rollouts); "
                                   "chat: messages in, text out via /chat/completions, no tokenizer needed "
                                   "(evaluation only: trajectories are marked not trainable). skyrl eval and skyrl rollout "
                                   "use chat when neither mode nor tokenizer is set.")
    base_url: str = Field("http://127.0.0.1:8000/v1",
                          description="Server root including the API version, e.g. what `vllm serve` prints.")
    model: str | None = Field(None, description="Served model name; None uses the first model listed at /models.")
    api_key: SecretStr | None = Field(None, description="Bearer token; None reads the env var named by api_key_env.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Env var holding the API key when api_key is unset.")
    tokenizer: str | None = Field(
        None, description="HF name or local path of the served model's tokenizer, loaded lazily with transformers; "
                          "needed only for servers that return text without token ids or take only text "
                          "prompts; not allowed in chat mode.")
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
    """The server answered with an HTTP error status; ``status`` holds it, ``server_message`` its reason."""

    def __init__(self, message: str, *, url: str, status: int | None = None, server_message: str = "") -> None:
        super().__init__(message, url=url, status=status)
        self.server_message = server_message


class OpenAITimeoutError(OpenAIEngineError):
    """No complete answer within ``timeout_s``."""


class WeightSyncUnsupportedError(EngineError, NotImplementedError):
    """The engine cannot load new weights (it talks to a server it does not control)."""


class OpenAIEngine:
    """Async client for an OpenAI-compatible server, implementing :class:`skyrl_core.engine.InferenceEngine`.

    Safe to call concurrently; at most ``max_concurrency`` requests are in flight. Use one engine per
    event loop at a time; ``aclose()`` (or ``async with``) releases its connections.

    ``in_flight_updates`` is ``"off"``: the remote model is frozen from here (``update_weights`` raises
    :class:`WeightSyncUnsupportedError`), so no update ever lands in a request.
    """

    in_flight_updates = "off"

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
        # What this server turned down, learnt from its 4xx answers: request fields per endpoint, and
        # prompts given as token ids (then the decoded text is sent).
        self._rejected: dict[str, set[str]] = {}
        self._text_prompts = False
        if self.config.mode == "chat":
            if tokenizer is not None or self.config.tokenizer:
                raise EngineError("engine.mode=chat needs no tokenizer (messages in, text out); drop "
                                  "engine.tokenizer, or use engine.mode=completions for token ids")
            self._tokenizer = ChatTextCodec()

    def __repr__(self) -> str:
        return f"OpenAIEngine(base_url={self.config.base_url!r}, model={self._model!r}, mode={self.config.mode!r})"

    @property
    def rejected_fields(self) -> dict[str, frozenset[str]]:
        """Request fields each endpoint of this server rejected so far (they are no longer sent)."""
        return {path: frozenset(names) for path, names in self._rejected.items()}

    @property
    def tokenizer(self) -> Any | None:
        """The tokenizer passed in, else ``config.tokenizer`` loaded with transformers; ``None`` if neither.

        In chat mode: a :class:`ChatTextCodec` (no transformers needed).
        """
        if self._tokenizer is None and self.config.tokenizer:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise EngineError("engine.tokenizer needs transformers: pip install transformers") from exc
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer)
            except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
                raise EngineError(f"cannot load engine.tokenizer {self.config.tokenizer!r}: {exc}. Without a "
                                  "tokenizer, use engine.mode=chat (chat completions, for evaluation)") from exc
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

    async def preflight(self) -> None:
        """Check, before any episode, that the server answers at ``engine.base_url`` and takes the API key:
        one ``GET /models`` without retries, waiting at most :data:`PREFLIGHT_TIMEOUT_S` seconds.

        Raises :class:`OpenAIEngineError` naming the URL when the server cannot be reached (connection
        refused, unknown host, timeout) or refuses the request. The connection is closed afterwards, so
        the engine may then be used on another event loop.
        """
        try:
            payload = await self._request("GET", "/models", attempts=1,
                                          timeout_s=min(self.config.timeout_s, PREFLIGHT_TIMEOUT_S))
        finally:
            await self.aclose()
        if self._model is None:
            try:
                self._model = str(payload["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise OpenAIEngineError(f"{self._url('/models')} lists no models; set engine.model",
                                        url=self._url("/models")) from None

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        """Continue ``prompt_ids``; at most ``params.max_tokens`` ids come back.

        Completions mode posts to ``/completions``; chat mode decodes the ids back into messages
        (they must come from this engine's :class:`ChatTextCodec`) and posts to ``/chat/completions``.
        """
        if self.config.mode == "chat":
            return await self._generate_chat(prompt_ids, params)
        url = self._url("/completions")
        body = {
            "model": await self.model_name(), "prompt": [int(i) for i in prompt_ids],
            **sampling_fields(params), "logprobs": 1, "return_tokens_as_token_ids": True,
            **self.config.extra_body,
        }
        while True:
            text_prompt = self._text_prompts
            if text_prompt:
                body["prompt"] = self._prompt_text(prompt_ids, url)
            try:
                payload = await self._post("/completions", body)
                break
            except OpenAIStatusError as exc:
                if text_prompt or not _rejects_id_prompts(exc):
                    raise
                if not self._text_prompts:  # concurrent requests may have learnt it meanwhile
                    log.warning("%s does not take prompts as token ids (%s); sending the decoded text from now on "
                                "(token ids will be re-tokenised)", url, exc.server_message)
                    self._text_prompts = True
        choice = first_choice(payload, url)
        if params.stop and "include_stop_str_in_output" in self._rejected["/completions"]:
            choice = stopped_client_side(choice, params.stop)
        output = completion_output(choice, params.max_tokens, self.tokenizer, url)
        if text_prompt:
            output.metadata.update(retokenized=True, token_source="retokenized")
        return output

    async def _generate_chat(self, prompt_ids: list[int], params: SamplingParams) -> GenerateOutput:
        codec: ChatTextCodec = self._tokenizer
        messages = codec.messages(prompt_ids)
        url = self._url("/chat/completions")
        body = {"model": await self.model_name(), **chat_sampling_fields(params), **self.config.extra_body,
                "messages": messages}
        choice = first_choice(await self._post("/chat/completions", body), url)
        reply = {"text": message_text(choice, url), "finish_reason": choice.get("finish_reason")}
        if params.stop:
            reply = stopped_client_side(reply, params.stop)
        text, finish_reason = reply["text"], reply["finish_reason"]
        ids = codec.encode(text)
        stop_reason = STOP_REASONS.get(finish_reason, "abort")
        if len(ids) >= params.max_tokens:
            ids, stop_reason = ids[:params.max_tokens], "length"
        elif stop_reason == "stop":
            ids.append(codec.eos_token_id)
        return GenerateOutput(ids, None, stop_reason, codec.decode(ids, skip_special_tokens=True),
                              {"finish_reason": finish_reason, "retokenized": False, "token_source": "text"})

    def _prompt_text(self, prompt_ids: list[int], url: str) -> str:
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise OpenAIEngineError(
                f"{url} takes prompts only as text; set engine.tokenizer so the token ids can be decoded, "
                "or use engine.mode=chat for evaluation", url=url)
        return str(tokenizer.decode(prompt_ids, skip_special_tokens=False))

    async def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST ``body`` less the fields this endpoint rejected; learn from a 4xx that names more of them."""
        rejected = self._rejected.setdefault(path, set())
        while True:
            sent = {key: value for key, value in body.items() if key not in rejected}
            if "include_stop_str_in_output" in rejected:  # the server would drop the stop string: stop here
                sent.pop("stop", None)
            try:
                return await self._request("POST", path, sent)
            except OpenAIStatusError as exc:
                names = rejected_fields(exc.status, exc.server_message, sent) - REQUIRED_FIELDS
                if not names:
                    raise
                if names - rejected:  # concurrent requests may have learnt them meanwhile
                    log.warning("%s rejects request field(s) %s; leaving them out from now on", self._url(path),
                                ", ".join(sorted(names - rejected)))
                rejected |= names

    async def chat(self, messages: Sequence[Mapping[str, str]], **sampling: Any) -> str:
        """The assistant's reply text from ``/chat/completions``.

        ``sampling`` holds request fields such as ``temperature`` or ``max_tokens`` (``model``
        overrides the configured one).
        """
        model = sampling.pop("model", None) or await self.model_name()
        body = {"model": model, **self.config.extra_body, **sampling, "messages": [dict(m) for m in messages]}
        url = self._url("/chat/completions")
        return message_text(first_choice(await self._post("/chat/completions", body), url), url)

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

    async def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                       attempts: int | None = None, timeout_s: float | None = None) -> Any:
        """Send one request with retries (``attempts`` in all, default ``max_retries + 1``); return the
        decoded JSON body or raise an OpenAIEngineError."""
        import httpx

        client, semaphore = self._session()
        url = self._url(path)
        attempts = self.config.max_retries + 1 if attempts is None else attempts
        timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        async with semaphore:  # held through backoff sleeps, so a struggling server sees fewer requests
            for attempt in range(attempts):
                retry_after = None
                try:
                    response = await client.request(method, url, json=body, timeout=timeout)
                except httpx.TimeoutException as exc:
                    waited = self.config.timeout_s if timeout_s is None else timeout_s
                    failure: OpenAIEngineError = OpenAITimeoutError(
                        f"{method} {url} timed out after {waited:g} s (engine.timeout_s)", url=url)
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
                                 url=url, status=status, server_message=message)

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
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def chat_sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """Chat request fields for ``params``: stop token ids are the codec's, meaningless to the server, and
    stop strings are applied here (chat servers drop the stop string from the reply; envs need it)."""
    body = sampling_fields(params)
    for key in ("stop_token_ids", "stop", "include_stop_str_in_output"):
        body.pop(key, None)
    return body


def stopped_client_side(choice: Mapping[str, Any], stop: Sequence[str]) -> dict[str, Any]:
    """``choice`` with its ``text`` cut after the first stop string (kept), finish reason ``stop`` if cut."""
    text = choice.get("text")
    hits = [(index, len(s)) for s in stop if isinstance(text, str) and (index := text.find(s)) >= 0]
    if not hits:
        return dict(choice)
    index, length = min(hits, key=lambda hit: (hit[0], -hit[1]))
    return {**choice, "text": text[:index + length], "finish_reason": "stop"}


def _rejects_id_prompts(error: OpenAIStatusError) -> bool:
    """A 400/422 saying the prompt must be text (it was sent as token ids)."""
    return error.status in (400, 422) and bool(PROMPT_MUST_BE_TEXT.search(error.server_message))


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


def message_text(choice: Mapping[str, Any], url: str) -> str:
    message = choice.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, str):
        raise OpenAIEngineError(f"{url} returned no message text (finish_reason "
                                f"{choice.get('finish_reason')!r})", url=url)
    return content


def completion_output(choice: Mapping[str, Any], max_tokens: int, tokenizer: Any | None,
                      url: str) -> GenerateOutput:
    """Token ids, logprobs and stop reason of one completions choice, cut to ``max_tokens``."""
    text = choice.get("text")
    text = text if isinstance(text, str) else ""
    finish_reason = choice.get("finish_reason")
    metadata: dict[str, Any] = {"finish_reason": finish_reason, "retokenized": False, "token_source": "exact"}
    ids, logprobs = sampled_tokens(choice.get("logprobs"), url)
    if ids is None:
        if tokenizer is None:
            raise OpenAIEngineError(
                f"{url} returned text without token ids (the server does not support vLLM's "
                "return_tokens_as_token_ids); set engine.tokenizer so the text can be tokenised", url=url)
        ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
        logprobs = None
        metadata.update(retokenized=True, token_source="retokenized")
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


class ChatTextCodec:
    """A tokenizer stand-in for chat mode: ids are Unicode code points plus three marker ids.

    A message renders as ``<start> role <sep> content <end>`` and the generation prompt as
    ``<start> assistant <sep>``, so the generator's context (prompt plus every turn) decodes back to
    the exact chat messages, and ``<end>`` is the end-of-turn (EOS) id. The markers are the private-use
    characters U+E000..U+E002 in rendered text and ids above the Unicode range in id lists; the same
    characters inside message content are replaced by U+FFFD.
    """

    START, SEP, END = "\ue000", "\ue001", "\ue002"
    MARKERS = {START: 0x110000, SEP: 0x110001, END: 0x110002}
    eos_token_id: int = MARKERS[END]

    def __init__(self) -> None:
        self._marker_chars = {i: c for c, i in self.MARKERS.items()}
        self._escape = str.maketrans({c: "\ufffd" for c in self.MARKERS})

    def apply_chat_template(self, conversation: Sequence[Mapping[str, str]], *, tokenize: bool = False,
                            add_generation_prompt: bool = False, **_: Any) -> str | list[int]:
        text = "".join(f"{self.START}{m['role']}{self.SEP}{str(m['content']).translate(self._escape)}{self.END}"
                       for m in conversation)
        if add_generation_prompt:
            text += f"{self.START}assistant{self.SEP}"
        return self.encode(text) if tokenize else text

    def encode(self, text: str, **_: Any) -> list[int]:
        return [self.MARKERS.get(c, ord(c)) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        if skip_special_tokens:
            return "".join(chr(i) for i in token_ids if i not in self._marker_chars)
        return "".join(self._marker_chars.get(i) or chr(i) for i in token_ids)

    def messages(self, token_ids: Sequence[int]) -> list[dict[str, str]]:
        """The chat messages of a context that ends with the generation prompt."""
        text = self.decode(token_ids)
        prompt = f"{self.START}assistant{self.SEP}"
        if not text.endswith(prompt):
            raise EngineError("engine.mode=chat: the context does not end with a new assistant turn (only whole "
                              "messages can be sent to /chat/completions)")
        *parts, rest = text[: -len(prompt)].split(self.END)
        if rest:
            raise EngineError("engine.mode=chat: the context continues an unfinished message (only whole "
                              "messages can be sent to /chat/completions)")
        messages = []
        for part in parts:
            role, sep, content = part.removeprefix(self.START).partition(self.SEP)
            if not part.startswith(self.START) or not sep:
                raise EngineError(f"engine.mode=chat: cannot read a chat message from {part[:80]!r}")
            messages.append({"role": role, "content": content})
        return messages
