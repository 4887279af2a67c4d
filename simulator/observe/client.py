"""One OpenAI-compatible server seen from the client: the pre-flight check and one request.

Times come from one monotonic clock whose origin is the start of the observation, in integer
µs, so a recorded trace's arrival, send and chunk times share one time axis (docs/behaviour.md
§9.5).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import ConfigError, invalid, unknown
from ..workload.trace import NOT_SENT_PREFIX

API_FORMATS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Error messages are kept to one short line in the trace.
MAX_ERROR_CHARS = 200
CONNECT_TIMEOUT_S = 10.0
RTT_PROBES = 3
# How the error message of a request that never went out starts (its send_time_us is 0).
NOT_SENT = NOT_SENT_PREFIX  # what replay looks for (workload/trace.py)


class Clock:
    """Microseconds since the observation started (monotonic, shared by every request)."""

    def __init__(self) -> None:
        self.origin_ns = time.perf_counter_ns()

    def now_us(self) -> int:
        return (time.perf_counter_ns() - self.origin_ns) // 1000


@dataclass
class Measurement:
    """What the client saw of one request; filled in as the response arrives, so a request cut
    short (timeout, interruption) keeps what it received."""

    send_us: int = 0  # 0: the request never went out (NOT_SENT in its error message)
    first_chunk_us: int = 0
    last_chunk_us: int = 0
    num_chunks: int = 0
    status: str = "ok"
    error_message: str = ""
    finish_reason: str = ""
    server_input_tokens: int = 0
    server_output_tokens: int | None = None  # usage.completion_tokens, when the server says
    chunk_times_us: list[int] = field(default_factory=list)

    def fail(self, status: str, message: str) -> None:
        self.status = status
        self.error_message = _one_line(message)

    def mark_not_sent(self) -> None:
        """A request that failed before it went out says so first in its message."""
        if not self.error_message.startswith(NOT_SENT):
            self.error_message = _one_line(f"{NOT_SENT} {self.error_message}")

    def output_tokens(self) -> int:
        """Tokens the server produced: its own count, else the text chunks received."""
        if self.server_output_tokens is not None:
            return self.server_output_tokens
        return self.num_chunks


def normalize_server_url(url: str) -> str:
    """`http://host:8000`, with a trailing `/` or `/v1` removed (both are common spellings)."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if not base.startswith(("http://", "https://")) or len(base.split("://", 1)[1]) == 0:
        raise invalid("--server-url", url, "must be an http:// or https:// URL")
    from urllib.parse import urlsplit

    # A port out of range or not a number, or a broken IPv6 host, fails here rather than
    # in the HTTP client's connection pool, mid-run, as a traceback.
    try:
        parts = urlsplit(base)
        parts.port  # noqa: B018 - reading it validates it
    except ValueError as exc:
        raise invalid("--server-url", url, f"not a valid URL ({exc})") from None
    if not parts.hostname:
        raise invalid("--server-url", url, "names no host")
    return base


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_ERROR_CHARS]


def _error_text(response_body: bytes) -> str:
    """The server's error message from an OpenAI error body, else the body itself."""
    text = response_body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return _one_line(text)
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return _one_line(err["message"])
        if isinstance(err, str):
            return _one_line(err)
    return _one_line(text)


# Where a chat stream carries generated text: the answer, then a reasoning model's thinking
# (current vLLM streams it as `reasoning`, older vLLM and SGLang as `reasoning_content`).
# Reasoning tokens are output tokens: the first of them is the first token (TTFT).
CHAT_TEXT_FIELDS = ("content", "reasoning", "reasoning_content")


def _choice_text(choice: dict) -> str:
    """Generated text of one streamed choice: completions `text`, chat `delta.content` or a
    reasoning model's `delta.reasoning` / `delta.reasoning_content`. A chat role
    announcement carries none."""
    if isinstance(choice.get("text"), str):
        return choice["text"]
    delta = choice.get("delta") or choice.get("message") or {}
    if not isinstance(delta, dict):
        return ""
    for name in CHAT_TEXT_FIELDS:
        text = delta.get(name)
        if isinstance(text, str) and text:
            return text
    return ""


class OpenAIServer:
    """Requests to one server; the httpx client is shared so connections are reused."""

    def __init__(
        self,
        server_url: str,
        model: str,
        *,
        api_format: str = "completions",
        api_key: str | None = None,
        streaming: bool = True,
        force_output: bool = True,
        max_connections: int = 256,
    ) -> None:
        if api_format not in API_FORMATS:
            raise unknown("API format (--api-format)", api_format, API_FORMATS)
        if not model.strip():
            raise invalid("--model", model, "must name the model the server serves")
        self.base_url = normalize_server_url(server_url)
        self.model = model
        self.api_format = api_format
        self.streaming = streaming
        self.force_output = force_output
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            headers=headers,
            # Plain http needs no certificates; loading them costs ~0.1 s per client.
            verify=self.base_url.startswith("https://"),
            # Reads are bounded by the request's own deadline, not by httpx.
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------------ pre-flight

    async def check(self) -> float:
        """Refuse to start against a server that is down, not OpenAI-compatible or does not
        serve the model (one clear error each); return the round-trip time in ms, the fastest
        of a few `GET /v1/models` (an upper bound: it includes the server's handling)."""
        url = f"{self.base_url}/v1/models"
        response = await self._get_models(url)
        if response.status_code in (401, 403):
            raise ConfigError(
                f"--api-key: {self.base_url} refused the request (HTTP {response.status_code}: "
                f"{_error_text(response.content)})"
            )
        served = self._served_models(url, response)
        if self.model not in served:
            raise unknown(f"model at {self.base_url} (--model)", self.model, served)
        rtts = []
        for _ in range(RTT_PROBES):
            started = time.perf_counter()
            await self._get_models(url)
            rtts.append((time.perf_counter() - started) * 1000)
        return round(min(rtts), 3)

    async def _get_models(self, url: str) -> httpx.Response:
        try:
            return await self.client.get(url, timeout=CONNECT_TIMEOUT_S)
        except httpx.ConnectError as exc:
            raise ConfigError(
                f"--server-url: cannot connect to {self.base_url}: {_one_line(str(exc))}"
            ) from None
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"--server-url: {self.base_url} did not answer GET /v1/models: "
                f"{type(exc).__name__} {_one_line(str(exc))}"
            ) from None

    def _served_models(self, url: str, response: httpx.Response) -> list[str]:
        not_openai = (
            f"--server-url: {self.base_url} does not look like an OpenAI-compatible server: "
            f"GET /v1/models returned HTTP {response.status_code}"
        )
        if response.status_code != 200:
            raise ConfigError(f"{not_openai} ({_error_text(response.content)})")
        try:
            doc = response.json()
        except ValueError:
            raise ConfigError(
                f"{not_openai} with a body that is not JSON ({_one_line(response.text[:60])!r}...)"
            ) from None
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            raise ConfigError(f"{not_openai} without the model list ('data')")
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    # ------------------------------------------------------------------ one request

    def body(self, prompt: str, output_tokens: int) -> dict[str, Any]:
        """The JSON body. Forced output asks vLLM/SGLang for exactly `output_tokens` tokens
        (`min_tokens` = `max_tokens`, `ignore_eos`); otherwise the length is only a cap."""
        body: dict[str, Any] = {"model": self.model, "stream": self.streaming}
        if self.api_format == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body["max_tokens"] = max(1, output_tokens)
        if self.force_output:
            body["min_tokens"] = max(1, output_tokens)
            body["ignore_eos"] = True
        if self.streaming:
            # Without this a streamed response carries no token counts.
            body["stream_options"] = {"include_usage": True}
        return body

    async def send(
        self,
        content: bytes,
        headers: dict[str, str],
        clock: Clock,
        m: Measurement,
        record_chunks: bool = False,
    ) -> None:
        """POST one request (`content`: the encoded JSON body) and record into `m`; never
        raises for a failed request (the failure is the record), except cancellation, which
        the caller records. `m.send_us` stays 0 unless the request went out (a connection
        that could not be opened sends nothing)."""
        url = self.base_url + API_FORMATS[self.api_format]
        attempt_us = clock.now_us()

        async def on_wire(event: str, _info: dict) -> None:
            # The send time is when the request starts to go out, after httpx has picked or
            # opened a connection: the client's own overhead is not the server's latency.
            # At least 1 µs: a send time of 0 means the request never went out.
            if event.endswith(".send_request_headers.started"):
                m.send_us = max(1, clock.now_us())

        try:
            async with self.client.stream(
                "POST",
                url,
                content=content,
                headers={**headers, "Content-Type": "application/json"},
                extensions={"trace": on_wire},
            ) as response:
                if not m.send_us:
                    # A transport without trace events: an answer proves the request went out.
                    m.send_us = max(1, attempt_us)
                if response.status_code != 200:
                    m.fail(
                        "error",
                        f"HTTP {response.status_code}: {_error_text(await response.aread())}",
                    )
                    return
                if self.streaming:
                    await self._read_stream(response, clock, m, record_chunks)
                else:
                    await self._read_whole(response, clock, m)
        except httpx.RemoteProtocolError as exc:
            m.fail("error", f"connection closed mid-response: {exc}")
        except httpx.HTTPError as exc:
            m.fail("error", f"{type(exc).__name__}: {exc}")

    def _usage(self, doc: dict, m: Measurement) -> None:
        usage = doc.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                m.server_input_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                m.server_output_tokens = usage["completion_tokens"]

    async def _read_stream(
        self, response: httpx.Response, clock: Clock, m: Measurement, record_chunks: bool
    ) -> None:
        """Server-sent events: `data: {json}` lines until `data: [DONE]`. A chunk is an event
        that carries generated text; role announcements and the usage event are not chunks."""
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            now_us = clock.now_us()
            try:
                event = json.loads(data)
            except ValueError:
                m.fail("error", f"malformed event: {data[:80]}")
                return
            if not isinstance(event, dict):
                m.fail("error", f"malformed event: {data[:80]}")
                return
            if "error" in event:
                m.fail("error", f"server error mid-stream: {_error_text(data.encode())}")
                return
            self._usage(event, m)
            for choice in event.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                if _choice_text(choice):
                    if m.num_chunks == 0:
                        m.first_chunk_us = now_us
                    m.last_chunk_us = now_us
                    m.num_chunks += 1
                    if record_chunks:
                        m.chunk_times_us.append(now_us)
                if choice.get("finish_reason"):
                    m.finish_reason = str(choice["finish_reason"])
        if not done:
            m.fail("error", "stream ended without data: [DONE]")

    async def _read_whole(self, response: httpx.Response, clock: Clock, m: Measurement) -> None:
        """A non-streamed response: first chunk = first body byte, last = body complete."""
        parts = []
        async for piece in response.aiter_bytes():
            if not parts:
                m.first_chunk_us = clock.now_us()
            parts.append(piece)
        m.last_chunk_us = clock.now_us()
        m.num_chunks = 1
        try:
            doc = json.loads(b"".join(parts))
        except ValueError:
            m.fail("error", "response body is not JSON")
            return
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
            m.fail("error", "response has no 'choices'")
            return
        self._usage(doc, m)
        for choice in doc["choices"]:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                m.finish_reason = str(choice["finish_reason"])
