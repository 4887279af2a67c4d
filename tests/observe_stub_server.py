"""A small OpenAI-compatible streaming server for the observe tests (test code only).

It listens on 127.0.0.1 only, serves one model, and answers `/v1/completions` and
`/v1/chat/completions` (streamed or not) on a known clock: the first token `ttft_ms` after the
request arrived, then one token every `itl_ms`, scheduled from the arrival so delays do not
accumulate. The output length is `max_tokens` when the client forces it (`ignore_eos` or
`min_tokens`), else `min(natural_output_tokens, max_tokens)`. Prompt tokens are whitespace
words. A chat stream sends its first `reasoning_tokens` tokens as a reasoning model's thinking,
in `delta.<reasoning_field>` (`reasoning`, as current vLLM names it, or `reasoning_content`).
Faults are chosen per request by the `X-Request-Id: servesim-<n>` header:

    http_500       answer 500 with an OpenAI error body
    slow_start     add `extra_ms` before the first token
    disconnect     close the connection after `after_tokens` tokens (no [DONE])
    error_event    send a `data: {"error": ...}` event after `after_tokens` tokens

Control endpoints: `POST /_stub/config` (JSON behaviour; clears the log) and `GET /_stub/log`
(one entry per completion request: request number, monotonic arrival time in µs, body).
`openai: false` makes every path answer an HTML page, like a web server that is not an LLM API.

Run as a program it prints `PORT <n>` once listening: `python tests/observe_stub_server.py`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_BEHAVIOUR = {
    "model": "stub-model",
    "ttft_ms": 20.0,
    "itl_ms": 2.0,
    "natural_output_tokens": 5,
    "reasoning_tokens": 0,
    "reasoning_field": "reasoning",
    "api_key": None,
    "openai": True,
    "faults": {},  # "<request number>": {"kind": ..., "after_tokens": k, "extra_ms": x}
}


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class StubState:
    def __init__(self) -> None:
        self.behaviour = dict(DEFAULT_BEHAVIOUR)
        self.log: list[dict] = []


async def _write_response(writer, status: int, body: bytes, content_type: str) -> None:
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()


async def _json(writer, status: int, doc) -> None:
    await _write_response(writer, status, json.dumps(doc).encode(), "application/json")


def _error(message: str, kind: str, code: int) -> dict:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": code}


async def _sleep_until(t_us: int) -> None:
    delay = t_us - _now_us()
    if delay > 0:
        await asyncio.sleep(delay / 1e6)


async def _complete(state: StubState, writer, path: str, headers: dict, body: dict, t0_us: int):
    b = state.behaviour
    chat = path.endswith("/chat/completions")
    rid_text = headers.get("x-request-id", "")
    number = rid_text.rsplit("-", 1)[-1] if rid_text else str(len(state.log))
    entry = {"request": number, "received_us": t0_us, "body": body}
    state.log.append(entry)
    if body.get("model") != b["model"]:
        message = f"The model `{body.get('model')}` does not exist."
        await _json(writer, 404, _error(message, "NotFoundError", 404))
        return True
    fault = b["faults"].get(number, {})
    kind = fault.get("kind")
    if kind == "http_500":
        await _json(writer, 500, _error("injected failure", "InternalServerError", 500))
        return True
    if chat:
        prompt_tokens = sum(len(m.get("content", "").split()) for m in body.get("messages", []))
    else:
        prompt_tokens = len(str(body.get("prompt", "")).split())
    cap = int(body.get("max_tokens") or 16)
    forced = body.get("ignore_eos") or body.get("min_tokens")
    n_out = cap if forced else min(b["natural_output_tokens"], cap)
    first_us = t0_us + int(b["ttft_ms"] * 1000) + int(fault.get("extra_ms", 0) * 1000)
    itl_us = int(b["itl_ms"] * 1000)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n_out,
        "total_tokens": prompt_tokens + n_out,
    }
    finish = "length"
    if not body.get("stream"):
        await _sleep_until(first_us + (n_out - 1) * itl_us)
        text = " tok" * n_out
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        choice["finish_reason"] = finish
        await _json(writer, 200, {"id": "cmpl-stub", "choices": [choice], "usage": usage})
        return True
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )

    async def event(doc) -> None:
        data = ("data: " + (doc if isinstance(doc, str) else json.dumps(doc)) + "\n\n").encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()

    def chunk(text: str, finish_reason, role: bool = False, thinking: bool = False) -> dict:
        if chat:
            field = b["reasoning_field"] if thinking else "content"
            delta = {"role": "assistant", "content": ""} if role else {field: text}
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice["finish_reason"] = finish_reason
        return {"id": "cmpl-stub", "model": b["model"], "choices": [choice]}

    for k in range(n_out):
        await _sleep_until(first_us + k * itl_us)
        if k == fault.get("after_tokens", -1) and kind == "disconnect":
            writer.close()
            return False
        if k == fault.get("after_tokens", -1) and kind == "error_event":
            await event({"error": _error("injected mid-stream error", "InternalServerError", 500)})
            break
        # Stamped before the write: `drain` can yield to other requests' handlers for
        # milliseconds, and a stamp taken after it could fall after the client already has
        # the chunk, which would make the client's TTFT look shorter than the server's.
        sent_us = _now_us()
        entry.setdefault("first_token_sent_us", sent_us)
        entry["last_token_sent_us"] = sent_us
        if k == 0 and chat:
            await event(chunk("", None, role=True))
        thinking = k < b["reasoning_tokens"]
        await event(chunk(" tok", finish if k == n_out - 1 else None, thinking=thinking))
    else:
        if (body.get("stream_options") or {}).get("include_usage"):
            await event({"id": "cmpl-stub", "choices": [], "usage": usage})
    await event("[DONE]")
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


def _authorized(state: StubState, headers: dict) -> bool:
    key = state.behaviour["api_key"]
    return not key or headers.get("authorization") == f"Bearer {key}"


async def _handle(state: StubState, reader, writer) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            t0_us = _now_us()
            method, target = line.decode().split(" ")[:2]
            headers = {}
            while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = h.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", 0) or 0))
            keep = True
            if not state.behaviour["openai"] and not target.startswith("/_stub"):
                page = b"<html><body>It works!</body></html>"
                await _write_response(writer, 200, page, "text/html")
            elif target == "/_stub/config" and method == "POST":
                state.behaviour = {**DEFAULT_BEHAVIOUR, **json.loads(raw)}
                state.log.clear()
                await _json(writer, 200, {"ok": True})
            elif target == "/_stub/log":
                await _json(writer, 200, state.log)
            elif target.startswith("/v1/") and not _authorized(state, headers):
                await _json(writer, 401, _error("invalid API key", "AuthenticationError", 401))
            elif target == "/v1/models":
                models = {"object": "list", "data": [{"id": state.behaviour["model"]}]}
                await _json(writer, 200, models)
            elif target in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                keep = await _complete(state, writer, target, headers, json.loads(raw), t0_us)
            else:
                await _json(writer, 404, _error(f"no route {target}", "NotFoundError", 404))
            if not keep:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def _serve(port: int) -> None:
    state = StubState()
    server = await asyncio.start_server(lambda r, w: _handle(state, r, w), "127.0.0.1", port)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class StubServer:
    """The stub in its own process (so its clock is not slowed by the client's work)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.process.kill()
            raise RuntimeError(f"stub server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def configure(self, **behaviour) -> None:
        import httpx

        httpx.post(f"{self.url}/_stub/config", json=behaviour).raise_for_status()

    def log(self) -> list[dict]:
        import httpx

        return httpx.get(f"{self.url}/_stub/log").json()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
