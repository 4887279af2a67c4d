"""Send a workload to a real server at its scheduled arrival times and record what happened.

The dispatcher walks the requests in arrival order, sleeps until each one is due, waits for a
free slot if `max_concurrency` requests are in flight, and starts it. Closed-loop sessions add
their next round when a round finishes (arrival = finish + think time), exactly as the
simulator's session manager does. Every started request yields one trace row with a status:
ok, error (HTTP or protocol failure, with the message), timeout (no complete response by its
deadline) or incomplete (still in flight when the observation was interrupted). A request that
never went out (its connection failed, or its deadline passed first, for instance while it
waited for a slot) is a row too, with send_time_us 0 and a message that starts `not sent:`.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import heapq
import itertools
import json
import math
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ..atomic_io import atomic_open
from ..engine.request import Request, RequestState, group_prefix_tokens
from ..errors import ConfigError, invalid
from ..interruption import HANDLED_SIGNALS, active_stop, signal_of, signals_held
from ..limits import MAX_TIME_S, MAX_TIME_US
from ..workload.generator import SessionManager
from ..workload.trace import (
    TRACE_V3_COLUMNS,
    TraceRow,
    format_float,
    write_trace_files,
)
from .client import NOT_SENT, Clock, Measurement, OpenAIServer
from .prompts import prompt_text

STATUSES = ("ok", "error", "timeout", "incomplete")


@dataclass
class ObserveOptions:
    """How to talk to the server (the `servesim observe` flags)."""

    server_url: str
    model: str
    api_format: str = "completions"
    streaming: bool = True
    max_concurrency: int = 256
    warmup_requests: int = 0
    api_key: str | None = None
    # None: measured in the pre-flight check.
    rtt_ms: float | None = None
    # False: the requested output length is only a cap (no min_tokens / ignore_eos).
    force_output: bool = True
    record_itl: bool = False
    # Client deadline of a request the workload gives none (BLIS's HTTP client: 5 minutes).
    request_timeout_s: float = 300.0
    server_type: str = "vllm"
    workload_description: str = ""

    def validate(self) -> None:
        if self.max_concurrency < 1:
            raise invalid("--max-concurrency", self.max_concurrency, "must be >= 1")
        if self.warmup_requests < 0:
            raise invalid("--warmup-requests", self.warmup_requests, "must be >= 0")
        if self.rtt_ms is not None and not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
            raise invalid("--rtt-ms", self.rtt_ms, "must be a finite number >= 0")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise invalid("--request-timeout-s", self.request_timeout_s, "must be > 0")
        if self.request_timeout_s > MAX_TIME_S:
            # Its deadline is recorded in deadline_us, which must stay on the clock.
            raise invalid(
                "--request-timeout-s", self.request_timeout_s, f"must be at most {MAX_TIME_S}"
            )


@dataclass
class Observation:
    """The recorded trace: header and rows (request_id = dispatch order), plus run facts."""

    header: dict[str, Any]
    rows: list[TraceRow]
    interrupted: bool = False
    chunk_times_us: dict[str, list[int]] = field(default_factory=dict)
    # The signal that interrupted the run (SIGINT, SIGTERM), when `interrupted`.
    signal_number: int | None = None

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for row in self.rows:
            out[row.status] += 1
        return out

    def not_sent(self) -> int:
        """Rows of requests that never went out (send_time_us 0; counted in `counts` by
        their status, `error`, `timeout` or `incomplete`)."""
        return sum(1 for row in self.rows if not row.send_time_us)

    def frame(self):
        """One row per request with the client-side latencies: ttft_ms = first chunk − send,
        e2e_ms = last chunk − send (as calibrate measures them), send_lag_ms = send −
        scheduled arrival; latencies are NaN where no chunk arrived."""
        import numpy as np
        import pandas as pd

        frame = pd.DataFrame([dataclasses.asdict(row) for row in self.rows])
        if frame.empty:
            return frame
        received = frame["num_chunks"] > 0
        frame["ttft_ms"] = np.where(
            received, (frame.first_chunk_time_us - frame.send_time_us) / 1000, np.nan
        )
        frame["e2e_ms"] = np.where(
            received, (frame.last_chunk_time_us - frame.send_time_us) / 1000, np.nan
        )
        sent = frame["send_time_us"] > 0
        frame["send_lag_ms"] = np.where(
            sent, (frame.send_time_us - frame.arrival_time_us) / 1000, np.nan
        )
        frame["warm_up"] = frame.request_id.astype(int) < self.header["warm_up_requests"]
        return frame

    def summary_text(self) -> str:
        counts = self.counts()
        lines = [
            f"observed {len(self.rows)} request(s) at {self.header['server']['model']}: "
            + ", ".join(f"{counts[s]} {s}" for s in STATUSES),
            f"measured_rtt_ms {self.header['network']['measured_rtt_ms']}",
        ]
        not_sent = self.not_sent()
        if not_sent:
            lines.append(
                f"not sent: {not_sent} request(s) never went out (send_time_us 0, counted "
                "above by status)"
            )
        frame = self.frame()
        if not frame.empty and frame.send_lag_ms.notna().any():
            lag = frame.send_lag_ms
            lines.append(f"send lag ms: p50 {lag.median():.2f}, max {lag.max():.2f}")
            ok = frame[(frame.status == "ok") & ~frame.warm_up]
            for metric in ("ttft_ms", "e2e_ms"):
                if len(ok):
                    q = ok[metric].quantile([0.5, 0.9, 0.99])
                    lines.append(
                        f"{metric}: p50 {q[0.5]:.2f}, p90 {q[0.9]:.2f}, p99 {q[0.99]:.2f} "
                        f"(ok requests after warm-up: {len(ok)})"
                    )
        if self.interrupted:
            lines.append("interrupted: requests in flight are recorded with status incomplete")
        return "\n".join(lines)

    def write_trace(
        self, header_path: str | Path, data_path: str | Path, itl_path: str | Path | None = None
    ) -> list[Path]:
        """Write the TraceV2 pair (v3 columns, so prefix groups replay with their real
        length) and, when chunk times were recorded, the per-chunk CSV."""
        refuse_nested_outputs(
            [("header_path", header_path), ("data_path", data_path), ("itl_path", itl_path)]
        )
        header_text = yaml.safe_dump(self.header, sort_keys=False, allow_unicode=True)
        rows = (_csv_fields(row) for row in self.rows)
        header_path, data_path = Path(header_path), Path(data_path)
        for path in (header_path, data_path, itl_path):
            if path is not None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_trace_files(header_path, data_path, header_text, TRACE_V3_COLUMNS, rows)
        written = [header_path, data_path]
        if itl_path is not None:
            chunk_rows = (
                (rid, i, t) for rid, times in self.chunk_times_us.items() for i, t in
                enumerate(times)
            )  # fmt: skip
            itl_path = Path(itl_path)
            write_chunk_times(itl_path, chunk_rows)
            written.append(itl_path)
        return written


def refuse_nested_outputs(outputs: list[tuple[str, str | Path | None]]) -> None:
    """Refuse an output whose path is the folder another output goes into (`--trace-data
    out` with `--trace-header out/h.yaml`): one of the two could not be written, and finding
    out after the measurement loses it. `outputs` are (name, path), None for one not asked
    for; paths that exist as the wrong kind are `check_output`'s to refuse."""
    resolved = [(name, path, Path(os.path.realpath(path))) for name, path in outputs if path]
    for name, path, real in resolved:
        for other_name, other_path, other_real in resolved:
            if real in other_real.parents:
                raise ConfigError(
                    f"{name}: {str(path)!r} is the folder {other_name} {str(other_path)!r} "
                    "goes into, so it cannot also be a file; give each output its own path"
                )


CHUNK_COLUMNS = ["request_id", "chunk_index", "time_us"]


def write_chunk_times(path: Path, rows: Iterable[tuple[str, int, int]]) -> None:
    """Per-chunk arrival times (µs, same axis as the trace), atomically like the trace."""
    with atomic_open(path, newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(CHUNK_COLUMNS)
        writer.writerows(rows)


def _csv_fields(row: TraceRow) -> list[str]:
    """The row's CSV fields, formatted as the simulator's own trace export formats them."""
    fields = []
    for name in TRACE_V3_COLUMNS:
        value = getattr(row, name)
        if isinstance(value, bool):
            fields.append("true" if value else "false")
        elif isinstance(value, float):
            fields.append(format_float(value))
        else:
            fields.append(str(value))
    return fields


def _row(
    request_id: int, req: Request, m: Measurement, streaming: bool, deadline_us: int
) -> TraceRow:
    shared = group_prefix_tokens(req)
    return TraceRow(
        request_id=str(request_id),
        arrival_time_us=req.arrival_us,
        # v3: the prompt after the shared prefix, so replay rebuilds prefix + suffix.
        input_tokens=req.input_tokens - shared,
        prefix_length=shared,
        prefix_group=req.prefix_group if shared else "",
        output_tokens=m.output_tokens(),
        client_id=req.client_id,
        tenant_id=req.tenant_id,
        slo_class=req.slo_class,
        model=req.model,
        deadline_us=deadline_us,
        first_chunk_time_us=m.first_chunk_us,
        last_chunk_time_us=m.last_chunk_us,
        status=m.status,
        session_id=req.session_id,
        round_index=req.round_index,
        streaming=streaming,
        text_tokens=req.text_tokens,
        image_tokens=req.image_tokens,
        audio_tokens=req.audio_tokens,
        video_tokens=req.video_tokens,
        reason_ratio=req.reason_ratio,
        server_input_tokens=m.server_input_tokens,
        send_time_us=m.send_us,
        num_chunks=m.num_chunks,
        error_message=m.error_message,
        finish_reason=m.finish_reason,
    )


Progress = Callable[[dict[str, int]], None]


class _Dispatcher:
    def __init__(
        self,
        requests: Iterable[Request],
        sessions: SessionManager | None,
        server: OpenAIServer,
        options: ObserveOptions,
        progress: Progress | None,
    ) -> None:
        self.planned: Iterator[Request] = iter(requests)
        self.next_planned: Request | None = next(self.planned, None)
        self.follow_ups: list[tuple[int, int, Request]] = []  # heap by arrival
        self.follow_up_order = itertools.count()
        self.request_ids = itertools.count()
        self.sessions = sessions
        self.server = server
        self.options = options
        self.progress = progress
        self.clock = Clock()
        self.slots = asyncio.Semaphore(options.max_concurrency)
        self.waiter: asyncio.Future | None = None
        self.dispatcher: asyncio.Task | None = None
        self.in_flight: set[asyncio.Task] = set()
        self.rows: list[TraceRow] = []
        self.chunk_times: dict[str, list[int]] = {}
        self.counts = dict.fromkeys(("sent", *STATUSES), 0)
        self.started = False  # a request was started: from here on the record is kept
        self.interrupted = False
        self.signal_number: int | None = None

    def _peek(self) -> Request | None:
        follow_up = self.follow_ups[0][2] if self.follow_ups else None
        if follow_up is None:
            return self.next_planned
        if self.next_planned is None or follow_up.arrival_us <= self.next_planned.arrival_us:
            return follow_up
        return self.next_planned

    def _pop(self, req: Request) -> None:
        if req is self.next_planned:
            self.next_planned = next(self.planned, None)
        else:
            heapq.heappop(self.follow_ups)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def _wait_wake(self, timeout_s: float | None) -> None:
        """Sleep until `timeout_s` passes or `_wake` is called, whichever is first. One bare
        future and one timer: `wait_for` would add tasks and loop turns to every send."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, self._wake)
        try:
            await self.waiter
        finally:
            if timer is not None:
                timer.cancel()
            self.waiter = None

    async def _take_slot(self, deadline_us: int) -> bool:
        """Wait for one of the `max_concurrency` slots; False, without one, when the
        request's deadline (0: none) passes first: it is then recorded as not sent, rather
        than held for a slot only to time out before it could go out."""
        while self.slots.locked():
            # A finishing request frees its slot, then wakes the dispatcher.
            if not deadline_us:
                await self._wait_wake(None)
                continue
            left_us = deadline_us - self.clock.now_us()
            if left_us <= 0:
                return False
            await self._wait_wake(left_us / 1e6)
        await self.slots.acquire()  # free: returns at once
        return True

    async def dispatch(self) -> None:
        prepared: tuple[Request, bytes] | None = None
        while True:
            req = self._peek()
            if req is None:
                if not self.in_flight:
                    return
                await self._wait_wake(None)  # a finishing round may start a follow-up
                continue
            if prepared is None or prepared[0] is not req:
                # Build the body while waiting, not after the request is due.
                body = self.server.body(prompt_text(req), req.output_tokens)
                prepared = (req, json.dumps(body).encode("utf-8"))
            delay_us = req.arrival_us - self.clock.now_us()
            if delay_us > 0:
                await self._wait_wake(delay_us / 1e6)
                continue  # re-check: a follow-up may now come first
            self._pop(req)
            has_slot = await self._take_slot(req.deadline_us)
            self.started = True
            task = asyncio.create_task(self._one(req, prepared[1], has_slot))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)

    async def _one(self, req: Request, content: bytes, has_slot: bool) -> None:
        # Numbered when it starts (tasks start in creation order), so a request cancelled
        # before it ran leaves no gap in the ids.
        request_id = next(self.request_ids)
        m = Measurement()
        opts = self.options
        self.counts["sent"] += 1
        self._report()
        headers = {"X-Request-Id": f"servesim-{request_id}"}
        if req.tenant_id:
            headers["x-gateway-inference-fairness-id"] = req.tenant_id
        if req.slo_class:
            headers["x-gateway-inference-objective"] = req.slo_class
        # The deadline this client applies, recorded as the row's deadline_us: the
        # workload's, else --request-timeout-s from now (on the trace's clock).
        now_us = self.clock.now_us()
        deadline_us = req.deadline_us or min(
            MAX_TIME_US, now_us + round(opts.request_timeout_s * 1e6)
        )
        timeout_s = (deadline_us - now_us) / 1e6
        try:
            if not has_slot:
                m.fail(
                    "timeout",
                    f"{NOT_SENT} its deadline passed while it waited for a free slot "
                    f"(--max-concurrency {opts.max_concurrency})",
                )
            elif timeout_s <= 0:
                m.fail("timeout", f"{NOT_SENT} its deadline passed before it could go out")
            else:
                async with asyncio.timeout(timeout_s):
                    await self.server.send(content, headers, self.clock, m, opts.record_itl)
        except TimeoutError:
            if m.send_us:
                m.fail("timeout", f"no complete response within {timeout_s:.3f} s")
            else:
                m.fail("timeout", f"no connection within {timeout_s:.3f} s")
        except asyncio.CancelledError:
            m.fail("incomplete", "observation interrupted")
        finally:
            if has_slot:
                self.slots.release()
        if not m.send_us:
            m.mark_not_sent()
        self.rows.append(_row(request_id, req, m, opts.streaming, deadline_us))
        if opts.record_itl:
            self.chunk_times[str(request_id)] = m.chunk_times_us
        self.counts[m.status] += 1
        if self.sessions is not None and req.session_id and not self.interrupted:
            req.state = RequestState.COMPLETED if m.status == "ok" else RequestState.TIMED_OUT
            req.generated_tokens = m.output_tokens()
            follow_up = self.sessions.on_finished(req, self.clock.now_us())
            if follow_up is not None:
                heapq.heappush(
                    self.follow_ups,
                    (follow_up.arrival_us, next(self.follow_up_order), follow_up),
                )
        # Leave the in-flight set before waking the dispatcher, which ends when it is empty.
        self.in_flight.discard(asyncio.current_task())
        self._wake()
        self._report()

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(dict(self.counts, in_flight=len(self.in_flight)))

    def interrupt(self, signal_number: int) -> None:
        """Stop sending and cancel the requests in flight (recorded as incomplete). The first
        signal decides (simulator/interruption.py): it is recorded where
        the CLI looks for it, so a later one is ignored while the trace is written."""
        stop = active_stop()
        if stop is not None and stop.first is None and not stop.closed:
            stop.first = signal_number
        if self.interrupted:
            return
        self.interrupted = True
        self.signal_number = stop.first if stop is not None and stop.first else signal_number
        if self.dispatcher is not None:
            self.dispatcher.cancel()
        for task in list(self.in_flight):
            task.cancel()

    async def run(self) -> None:
        if self.interrupted:
            return
        self.dispatcher = asyncio.create_task(self.dispatch())
        try:
            await self.dispatcher
        except asyncio.CancelledError:
            if not self.interrupted:
                raise
        if self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)


def _signals_to_catch() -> list[int]:
    """The signals an observation turns into "stop and keep what was measured": SIGINT
    (Ctrl-C) unless it is ignored; SIGTERM as well where servesim's own handling of it is in
    force (the `servesim` command: `interruption.stopping_on_signals`). Elsewhere SIGTERM
    keeps the meaning the calling program gave it (by default it ends the process)."""
    caught = []
    for sig in HANDLED_SIGNALS:
        handler = signal.getsignal(sig)
        if handler is signal.SIG_IGN:
            continue  # a shell's background job ignores SIGINT: it stays ignored
        if sig == signal.SIGINT or (active_stop() is not None and callable(handler)):
            caught.append(sig)
    return caught


@contextlib.contextmanager
def _signals_caught(run: _Dispatcher, enabled: bool) -> Iterator[None]:
    """Inside the block the caught signals (`_signals_to_catch`) interrupt `run` through the
    event loop; on leaving, their previous handlers come back (asyncio would reset them to
    Python's defaults, and a later signal would then be reported as SIGINT's traceback or
    kill the process mid-write)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous: dict[int, Any] = {}
    try:
        for sig in _signals_to_catch():
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, run.interrupt, sig)
        yield
    finally:
        # Held back while the handlers are swapped: in between, asyncio's reset would let a
        # SIGTERM end the process. One that comes meanwhile reaches the restored handler.
        with signals_held(tuple(previous)):
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:
                    signal.signal(sig, handler)


async def observe_requests(
    requests: Iterable[Request],
    options: ObserveOptions,
    *,
    sessions: SessionManager | None = None,
    progress: Progress | None = None,
    handle_interrupt: bool = True,
) -> Observation:
    """Check the server, send `requests` (arrival order, µs from the start) and record them.

    With `handle_interrupt`, Ctrl-C (SIGINT, main thread only; SIGTERM too inside the
    `servesim` command) stops sending, cancels the requests in flight (recorded as
    incomplete) and returns what was measured so far. An interrupt escapes (as
    KeyboardInterrupt) only before any request was started.
    """
    options.validate()
    server = OpenAIServer(
        options.server_url,
        options.model,
        api_format=options.api_format,
        api_key=options.api_key,
        streaming=options.streaming,
        force_output=options.force_output,
        max_connections=options.max_concurrency,
    )
    run: _Dispatcher | None = None
    try:
        measured_rtt_ms = await server.check()
        created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        run = _Dispatcher(requests, sessions, server, options, progress)
        try:
            with _signals_caught(run, handle_interrupt):
                await run.run()
                await server.aclose()  # while the signals are still caught
        except KeyboardInterrupt as exc:
            # A signal an instant before the handlers were in place or after they were
            # removed, when nothing is in flight: once a request was started, the record
            # is kept (the first signal decides the exit status).
            if run.in_flight:
                raise
            _interrupted_after(run, exc, handle_interrupt)
    finally:
        try:
            await server.aclose()  # a second, quick close once the run closed it
        except KeyboardInterrupt as exc:
            _interrupted_after(run, exc, handle_interrupt)
    while True:
        try:
            return _observation(run, options, created_at, measured_rtt_ms)
        except KeyboardInterrupt as exc:
            # The measurement is over: a signal now only marks it interrupted, and the record
            # is built again (a later signal is ignored once the first has decided).
            _interrupted_after(run, exc, handle_interrupt)


def _interrupted_after(
    run: _Dispatcher | None, exc: KeyboardInterrupt, handle_interrupt: bool
) -> None:
    """A signal (`exc`) once the requests are done: mark `run` interrupted by it (unless one
    already did) when its record is kept, i.e. interrupts are handled and a request was
    started; else let it end the observation (raise `exc`)."""
    if not (handle_interrupt and run is not None and run.started):
        raise exc
    if not run.interrupted:
        run.interrupted = True
        run.signal_number = signal_of(exc)


def _observation(
    run: _Dispatcher, options: ObserveOptions, created_at: str, measured_rtt_ms: float
) -> Observation:
    """The finished run's record: its rows in request order, the header, the chunk times."""
    rows = sorted(run.rows, key=lambda r: int(r.request_id))
    header = {
        "trace_version": 3,
        "time_unit": "microseconds",
        "created_at": created_at,
        "mode": "real",
        "warm_up_requests": options.warmup_requests,
        "workload_spec": options.workload_description,
        "server": {"type": options.server_type, "model": options.model},
        "network": {
            "measured_rtt_ms": options.rtt_ms if options.rtt_ms is not None else measured_rtt_ms
        },
    }
    chunk_times = (
        {r.request_id: run.chunk_times[r.request_id] for r in rows} if (options.record_itl) else {}
    )
    return Observation(header, rows, run.interrupted, chunk_times, run.signal_number)


def run_observation(coro) -> Observation:
    """Run an observation coroutine to completion from synchronous code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise ConfigError(
        "observe: called inside a running event loop (a notebook?); use "
        "`await simulator.observe_async(...)` there"
    )
