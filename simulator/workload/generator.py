"""Requests from a v2 workload spec, generated lazily in arrival order (docs/behaviour.md §9.3).

Each client is an independent stream with its own seeded generators (docs/behaviour.md §A9): adding,
removing or changing one client never changes another client's draws. Streams are merged by
arrival time and truncated at `num_requests`, so a million-request workload is produced on
demand instead of materialised up front.

Multi-turn clients start a session per arrival. Open-loop sessions pre-generate every round;
closed-loop sessions (the default for multi-turn) generate round N+1 only when round N
completes, through the `SessionManager` the simulation calls on every finished request.
Concurrency clients (closed-loop users, `closed_loop.py`) work the same way: only each user's
first request is in the stream, the rest follow completions.

A lifecycle window that overrides the client's rate (`trace_rate`), arrival process or length
laws is a period of its own: its requests come from its own arrival process, started at the
window's opening and stopped at its end (docs/workloads.md, "Time-varying windows").
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..engine.request import Request, RequestState, prefix_key
from ..errors import ConfigError
from ..limits import MAX_REQUESTS, MAX_TIME_US, check_time_us
from ..rng import stream_seed
from .arrivals import ArrivalProcess, make_arrivals
from .cohorts import expand_cohorts, expand_inference_perf
from .lengths import LengthDistribution, from_dist_spec, ratio_from_dist_spec
from .spec import (
    DEFAULT_PREFIX_LENGTH,
    ActiveWindow,
    ArrivalSpec,
    ClientSpec,
    CohortSpec,
    DistSpec,
    WorkloadSpec,
)

CHUNK = 1024  # draws per numpy call: amortises call overhead without holding much memory
# A request keyed for the merge of the clients' streams: (arrival, rank, order, the request
# (None: a closed-loop round's place), the session it opens when it is one's first request).
Keyed = tuple[int, int, int, "Request | None", object]


class _Draws:
    """Chunked draws from one distribution on one stream."""

    __slots__ = ("dist", "rng", "buf", "pos")

    def __init__(self, dist: LengthDistribution, rng: np.random.Generator) -> None:
        self.dist, self.rng, self.buf, self.pos = dist, rng, np.empty(0), 0

    def next(self) -> int:
        if self.pos >= len(self.buf):
            self.buf = self.dist.sample(self.rng, CHUNK).tolist()
            self.pos = 0
        value = self.buf[self.pos]
        self.pos += 1
        return value


@dataclass
class _Modal:
    text: _Draws
    parts: list[tuple[str, _Draws, _Draws]]  # (modality, count draws, size draws)


def _process(arrival: ArrivalSpec, rate_per_s: float) -> ArrivalProcess:
    return make_arrivals(arrival.process, rate_per_s, arrival.cv, arrival.shape, arrival.scale)


@dataclass
class Period:
    """A lifecycle window with its own traffic: arrivals from its own process between its
    opening and its end, lengths from its own laws where it gives them."""

    start_us: int
    end_us: int
    arrivals: ArrivalProcess
    arrival_rng: np.random.Generator
    inputs: _Draws | None
    outputs: _Draws | None


def merged_windows(windows: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) windows as sorted, disjoint intervals: a client is active when the time
    lies in any of its windows, and `ClientPlan.active` looks at one interval only (a long
    window overlapped by a later, shorter one was cut at the shorter one's end)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass
class ClientPlan:
    """Everything needed to generate one client's requests."""

    index: int
    key: str
    spec: ClientSpec
    rate_per_s: float
    prefix_length: int
    windows: list[tuple[int, int]]
    seed: int
    base_dir: Path | None
    # No other client shares this one's key (content keys are built from it).
    unique_key: bool = True
    # Windows with traffic of their own, each with its rate (req/s); see `Period`.
    period_windows: list[tuple[int, ActiveWindow, float]] = field(default_factory=list)
    # The client's place in the user's input, for errors (`client_places`): a cohort's member
    # is named by its cohort, not by its index in the expanded list.
    where: str = ""

    def __post_init__(self) -> None:
        c = self.spec
        where = self.where or f"clients[{self.index}]"
        rng = lambda name: stream_seed(self.seed, "client", self.key, name)  # noqa: E731
        # The client's own arrival process runs unless it is closed-loop, or every one of its
        # windows is a period (which then brings all of its traffic).
        self.base_traffic = (
            c.arrival is not None
            and not c.concurrency_users
            and not (self.period_windows and not self.windows)
            and self.rate_per_s > 0
        )
        self.arrivals: ArrivalProcess | None = (
            _process(c.arrival, self.rate_per_s) if self.base_traffic else None
        )
        self.arrival_rng = rng("arrival")
        self.periods = []
        for k, window, rate in self.period_windows:
            w_where = f"{where}.lifecycle.windows[{k}]"
            self.periods.append(
                Period(
                    window.start_us,
                    window.end_us,
                    _process(window.arrival or c.arrival, rate),
                    rng(f"window.{k}.arrival"),
                    _Draws(
                        from_dist_spec(
                            window.input_distribution,
                            self.base_dir,
                            where=f"{w_where}.input_distribution",
                        ),
                        rng(f"window.{k}.input"),
                    )
                    if window.input_distribution is not None
                    else None,
                    _Draws(
                        from_dist_spec(
                            window.output_distribution,
                            self.base_dir,
                            where=f"{w_where}.output_distribution",
                        ),
                        rng(f"window.{k}.output"),
                    )
                    if window.output_distribution is not None
                    else None,
                )
            )
        self.inputs = _Draws(
            from_dist_spec(
                c.input_distribution, self.base_dir, where=f"{where}.input_distribution"
            ),
            rng("input"),
        )
        self.outputs = _Draws(
            from_dist_spec(
                c.output_distribution, self.base_dir, where=f"{where}.output_distribution"
            ),
            rng("output"),
        )
        self.modal: _Modal | None = None
        mm = c.multimodal
        if mm is not None:
            parts = []
            for modality in ("image", "audio", "video"):
                count = getattr(mm, f"{modality}_count_distribution")
                size = getattr(mm, f"{modality}_distribution")
                if count is None or size is None:
                    continue
                parts.append(
                    (
                        modality,
                        _Draws(
                            from_dist_spec(
                                count,
                                self.base_dir,
                                minimum=0,
                                where=f"{where}.multimodal.{modality}_count_distribution",
                            ),
                            rng(f"{modality}.count"),
                        ),
                        _Draws(
                            from_dist_spec(
                                size,
                                self.base_dir,
                                where=f"{where}.multimodal.{modality}_distribution",
                            ),
                            rng(f"{modality}.size"),
                        ),
                    )
                )
            text_where = (
                f"{where}.multimodal.text_distribution"
                if mm.text_distribution is not None
                else f"{where}.input_distribution"
            )
            text = mm.text_distribution or c.input_distribution
            self.modal = _Modal(
                _Draws(from_dist_spec(text, self.base_dir, where=text_where), rng("text")),
                parts,
            )
        # Output lengths that only space a closed-loop session's rounds as open loop would,
        # for counting them against num_requests (`WorkloadStream._client_requests`); their
        # own stream, so the requests' draws do not depend on them.
        self.planned_outputs = (
            _Draws(
                from_dist_spec(
                    c.output_distribution, self.base_dir, where=f"{where}.output_distribution"
                ),
                rng("planned_round_output"),
            )
            if c.multi_turn is not None and c.is_closed_loop
            else None
        )
        self.ratio: _Draws | None = None
        if c.reasoning is not None and c.reasoning.reason_ratio_distribution is not None:
            self.ratio = _Draws(
                ratio_from_dist_spec(
                    c.reasoning.reason_ratio_distribution,
                    self.base_dir,
                    where=f"{where}.reasoning.reason_ratio_distribution",
                ),
                rng("reason_ratio"),
            )
        self.timeout_us = c.timeout_us()
        self.multi_turn = c.multi_turn
        self.closed_loop = c.is_closed_loop
        self.private_content = self.unique_key and (
            c.multi_turn is None or c.multi_turn.context_growth != "accumulate"
        )
        self._seq = itertools.count()

    def active(self, t_us: int) -> bool:
        if not self.windows:
            return True
        i = bisect.bisect_right(self.windows, (t_us, float("inf"))) - 1
        return i >= 0 and self.windows[i][0] <= t_us < self.windows[i][1]

    @property
    def last_active_us(self) -> int | None:
        """When the client's traffic ends by itself (None: it never does)."""
        if self.spec.concurrency_users:
            return None
        ends = [p.end_us for p in self.periods]
        if self.base_traffic:
            if not self.windows:
                return None
            ends += [end for _, end in self.windows]
        return max(ends, default=0)

    @property
    def ends_by_itself(self) -> bool:
        """Does the client's traffic end without a horizon or num_requests? A client of one
        session (`single_session`) sends its max_rounds rounds and stops, at a time its
        closed loop decides."""
        mt = self.multi_turn
        return (mt is not None and mt.single_session) or self.last_active_us is not None

    def new_request(
        self, arrival_us: int, context: list | None = None, period: Period | None = None
    ) -> Request:
        """Sample one request's lengths and content; IDs are assigned at the merge."""
        c = self.spec
        seq = next(self._seq)
        text = image = audio = video = 0
        if period is not None and period.inputs is not None:
            fresh = period.inputs.next()
        elif self.modal is not None:
            text = self.modal.text.next()
            extra = {"image": 0, "audio": 0, "video": 0}
            for modality, count, size in self.modal.parts:
                extra[modality] = sum(size.next() for _ in range(count.next()))
            image, audio, video = extra["image"], extra["audio"], extra["video"]
            fresh = text + image + audio + video
        else:
            fresh = self.inputs.next()
        if period is not None and period.outputs is not None:
            output = period.outputs.next()
        else:
            output = self.outputs.next()
        segments: list = []
        if context is not None:
            segments.extend(context)
        elif c.prefix_group and self.prefix_length > 0:
            segments.append((prefix_key(c.prefix_group), self.prefix_length))
        segments.append((("in", self.key, seq), fresh))
        input_tokens = sum(n for _, n in segments)
        req = Request(
            "",
            arrival_us,
            input_tokens,
            output,
            deadline_us=arrival_us + self.timeout_us if self.timeout_us else 0,
            segments=segments,
            slo_class=c.slo_class,
            tenant_id=c.tenant_id,
            model=c.model,
            client_id=c.id or f"client_{self.index}",
            prefix_group=c.prefix_group,
            streaming=c.streaming,
            text_tokens=text,
            image_tokens=image,
            audio_tokens=audio,
            video_tokens=video,
            reason_ratio=self.ratio.next() if self.ratio is not None else 0.0,
            adapter=c.adapter,
        )
        req.output_key = ("out", self.key, seq)
        if context is None and self.private_content:
            # The fresh segment (and the output) are this request's alone: only a later round
            # of an accumulating session, or another client with the same key, could repeat
            # them.
            req.private_from_token = input_tokens - fresh
        return req

    def check_deadline(self, req: Request) -> None:
        """Refuse a deadline (arrival + timeout) the clock cannot hold."""
        check_time_us(
            req.deadline_us,
            f"client {self.key!r}: timeout ({self.timeout_us} µs) after arrival at "
            f"{req.arrival_us} µs: the deadline",
        )

    def next_round_context(self, prev: Request, produced_tokens: int) -> list | None:
        """Prompt prefix of the next round: everything said so far when context accumulates."""
        if self.multi_turn is None or self.multi_turn.context_growth != "accumulate":
            return None
        return [*prev.segments, (prev.output_key, produced_tokens)]

    def arrival_instants(self, horizon_us: int | None) -> Iterator[tuple[int, Period | None]]:
        """Every arrival of the client in time order, with the period it belongs to (None:
        the client's own process)."""
        streams = []
        if self.base_traffic:
            streams.append(self._tagged(self.arrival_times(horizon_us), 0, None))
        for k, period in enumerate(self.periods, 1):
            streams.append(self._tagged(self._period_times(period, horizon_us), k, period))
        if len(streams) == 1:
            for t, _, period in streams[0]:
                yield t, period
            return
        for t, _, period in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
            yield t, period

    @staticmethod
    def _tagged(
        times: Iterator[int], rank: int, period: Period | None
    ) -> Iterator[tuple[int, int, Period | None]]:
        for t in times:
            yield t, rank, period

    def _period_times(self, period: Period, horizon_us: int | None) -> Iterator[int]:
        """A period's arrivals, as BLIS spreads them: n = ⌈rate × duration⌉ requests whose gaps
        are drawn from the period's process and then scaled together so that the gaps fill
        the window (truncated to whole µs). The rate fixes the count, the process the shape
        of the gaps. n + 1 gaps are drawn and the last one only closes the window, so all n
        arrivals fall inside it (BLIS lets the n-th land on the window's end and drops it)."""
        stop = period.end_us if horizon_us is None else min(period.end_us, horizon_us)
        duration_us = stop - period.start_us
        if duration_us <= 0:
            return
        n = math.ceil(period.arrivals.rate_per_s * duration_us / 1e6)
        if n > MAX_REQUESTS:
            raise ConfigError(
                f"client {self.key!r}: a lifecycle window of {duration_us / 1e6:g} s at "
                f"{period.arrivals.rate_per_s:g} requests/s holds {n:,} requests; at most "
                f"{MAX_REQUESTS:,} per run"
            )
        rng = period.arrival_rng
        # Two passes over the same draws (the scale needs their sum), chunk by chunk.
        state = rng.bit_generator.state
        total = 0.0
        for start in range(0, n + 1, CHUNK):
            count = min(CHUNK, n + 1 - start)
            total += float(period.arrivals.gaps_us(rng, count).sum(dtype=np.float64))
        rng.bit_generator.state = state
        scale = duration_us / total
        t = period.start_us
        left = n
        while left:
            count = min(CHUNK, left)
            for gap in period.arrivals.gaps_us(rng, count).tolist():
                t += int(gap * scale)
                yield t
            left -= count

    def arrival_times(self, horizon_us: int | None) -> Iterator[int]:
        t = 0
        stop = max(end for _, end in self.windows) if self.windows else None
        if horizon_us is not None:
            stop = horizon_us if stop is None else min(stop, horizon_us)
        while True:
            gaps = self.arrivals.gaps_us(self.arrival_rng, CHUNK)
            if self.windows and not self.active(t):
                # A whole chunk of arrivals that all fall before the next window opens (a
                # client that comes online later) is skipped at once; same draws, same result.
                opens = self._next_window_start(t)
                chunk_end = t + float(gaps.sum(dtype=np.float64))
                if (
                    opens is not None
                    and chunk_end < opens - 1
                    and (stop is None or chunk_end < stop)
                ):
                    t += int(gaps.sum())
                    continue
            for gap in gaps.tolist():
                t += gap
                if stop is not None and t >= stop:
                    return
                if self.active(t):
                    yield t

    def _next_window_start(self, t_us: int) -> int | None:
        """Start of the first activity window after `t_us` (None when none is left)."""
        i = bisect.bisect_right(self.windows, (t_us, float("inf")))
        return self.windows[i][0] if i < len(self.windows) else None


# A round in none of these states has ended without completing.
_UNFINISHED_OR_COMPLETED = frozenset(
    {RequestState.CREATED, RequestState.QUEUED, RequestState.RUNNING, RequestState.COMPLETED}
)


@dataclass
class Session:
    session_id: str
    plan: ClientPlan
    rounds_total: int
    rounds_done: int = 0
    outcome: str = ""  # completed | cancelled | horizon_interrupted
    # Open-loop sessions: every round, generated up front (the run only decides their fate).
    rounds: list[Request] = field(default_factory=list)

    def open_loop_outcome(self) -> str:
        states = [r.state for r in self.rounds]
        # Any end but completion cancels it: timed out, dropped, rejected, dropped on a drain
        # or failed with its node (closed loop: `SessionManager.on_finished`).
        if any(s not in _UNFINISHED_OR_COMPLETED for s in states):
            return "cancelled"
        if len(self.rounds) == self.rounds_total and all(
            s is RequestState.COMPLETED for s in states
        ):
            return "completed"
        return "horizon_interrupted"


@dataclass
class SessionManager:
    """Closed-loop sessions: the next request is created when the previous one finishes.

    Multi-turn sessions (`Session`) live here; closed-loop users and replayed sessions
    (`closed_loop.py`) bring their own `follow_up` rule and share the run-wide follow-up
    budget and naming."""

    horizon_us: int | None
    sessions: dict[str, Session] = field(default_factory=dict)
    _follow_up_index: itertools.count = field(default_factory=lambda: itertools.count(1 << 40))
    # Closed-loop users may send this many follow-ups in all (None = no cap): what is left of
    # the workload's num_requests after every first request.
    follow_up_budget: int | None = None
    follow_ups: int = 0

    def register(self, req: Request, session: Session) -> None:
        self.sessions[session.session_id] = session
        req.session_id = session.session_id
        req.round_index = 0

    def budget_left(self) -> bool:
        return self.follow_up_budget is None or self.follow_ups < self.follow_up_budget

    def name_follow_up(self, nxt: Request, session_id: str, round_index: int) -> Request:
        """Tag and name a closed-loop follow-up as BLIS does (`session_<id>_round_<r>_<k>`)."""
        from .closed_loop import follow_up_id

        self.follow_ups += 1
        nxt.session_id = session_id
        nxt.round_index = round_index
        nxt.request_id = follow_up_id(session_id, round_index, self.follow_ups)
        nxt.index = next(self._follow_up_index)
        return nxt

    def on_finished(
        self, req: Request, now_us: int, step_end_us: int | None = None
    ) -> Request | None:
        """Called once per finished request; returns the next request to inject, if any.

        `now_us`: when the request finished for its client (its completion time, overheads
        included); `step_end_us`: the end of the engine step that finished it, from which
        closed-loop users and replayed sessions count their think time (current BLIS)."""
        session = self.sessions.get(req.session_id)
        if session is None or session.outcome:
            return None
        follow_up = getattr(session, "follow_up", None)
        if follow_up is not None:
            return follow_up(req, now_us if step_end_us is None else step_end_us, self)
        if not session.plan.closed_loop:
            return None
        if req.state is not RequestState.COMPLETED:
            # A timed-out, dropped, rejected or failed (node failure) round ends it.
            session.outcome = "cancelled"
            return None
        session.rounds_done += 1
        if session.rounds_done >= session.rounds_total:
            session.outcome = "completed"
            return None
        plan = session.plan
        # From the end of the step that finished the round, as closed-loop users do and as
        # BLIS does (its completion tick, without a latency model's post-decode overheads).
        tick_us = now_us if step_end_us is None else step_end_us
        arrival = tick_us + plan.multi_turn.think_time_us
        if self.horizon_us is not None and arrival > self.horizon_us:
            session.outcome = "horizon_interrupted"
            return None
        if arrival > MAX_TIME_US:
            check_time_us(
                arrival,
                f"client {plan.key!r}: think_time_us "
                f"({plan.multi_turn.think_time_us}): round {session.rounds_done} of "
                f"{session.session_id}, after {tick_us} µs, arrives",
            )
        nxt = plan.new_request(arrival, plan.next_round_context(req, req.generated_tokens))
        if nxt.deadline_us > MAX_TIME_US:
            plan.check_deadline(nxt)
        nxt.session_id = session.session_id
        nxt.round_index = session.rounds_done
        nxt.request_id = f"{session.session_id}_round_{session.rounds_done}"
        nxt.index = next(self._follow_up_index)
        return nxt

    def finalize(self) -> dict[str, int]:
        """Every session's single outcome; closed-loop sessions still open when the run ended
        were cut by the horizon (INV-11)."""
        counts = {"completed": 0, "cancelled": 0, "horizon_interrupted": 0, "budget_exhausted": 0}
        for session in self.sessions.values():
            if session.rounds:
                session.outcome = session.open_loop_outcome()
            elif not session.outcome:
                session.outcome = "horizon_interrupted"
            counts[session.outcome] = counts.get(session.outcome, 0) + 1
        counts["total"] = len(self.sessions)
        return counts


def _prefix_lengths(clients: list[ClientSpec]) -> dict[str, int]:
    """The first client of a prefix group fixes the group's prefix length (docs/behaviour.md
    §9.2)."""
    lengths: dict[str, int] = {}
    for c in clients:
        if c.prefix_group and c.prefix_group not in lengths:
            lengths[c.prefix_group] = (
                c.prefix_length if c.prefix_length is not None else DEFAULT_PREFIX_LENGTH
            )
    return lengths


def resolve_clients(spec: WorkloadSpec, base_dir: Path | None = None) -> tuple[WorkloadSpec, list]:
    """Expand inference_perf / servegen / cohorts into a flat client list."""
    if spec.inference_perf is not None:
        spec = expand_inference_perf(spec)
    if spec.servegen_data is not None:
        from .servegen import expand_servegen, expand_servegen_periods

        if spec.servegen_data.multi_period:
            spec = expand_servegen_periods(spec, base_dir)
        else:
            spec = expand_servegen(spec, base_dir)
    return spec, expand_cohorts(spec)


def client_places(
    given: WorkloadSpec, resolved: WorkloadSpec, count: int, where: str = ""
) -> list[str]:
    """Each resolved client's place in the user's input, for errors: `clients[i]` for a
    client, `cohorts[k]` for every member of cohort k, and the section a converter expanded
    (servegen_data, inference_perf) with the client's id. `where` names the spec itself
    (`workload.` inline in a scenario, `<file>: ` for a spec file)."""
    places: list[str] = []
    if given.clients:
        places.extend(f"{where}clients[{i}]" for i in range(len(resolved.clients)))
    else:
        section = "inference_perf" if given.inference_perf is not None else "servegen_data"
        places.extend(f"{where}{section} (client {c.id!r})" for c in resolved.clients)
    # A converter puts its own cohorts first and passes the spec's cohorts on, in order.
    converted = len(resolved.cohorts) - len(given.cohorts)
    for k, cohort in enumerate(resolved.cohorts):
        place = (
            f"{where}servegen_data (cohort {cohort.id!r})"
            if k < converted
            else f"{where}cohorts[{k - converted}]"
        )
        places.extend([place] * cohort.population)
    if len(places) != count:  # a form this naming does not know: say the expanded index
        return [f"{where}clients[{i}]" for i in range(count)]
    return places


def _member_laws(member: ClientSpec | CohortSpec) -> Iterator[tuple[str, DistSpec, str]]:
    """The laws a client or cohort draws from, as `ClientPlan` builds them: (kind, law, path
    below the member), kind "length", "count" (floored at 0) or "ratio"."""
    yield "length", member.input_distribution, "input_distribution"
    yield "length", member.output_distribution, "output_distribution"
    windows = (
        member.lifecycle.windows if isinstance(member, ClientSpec) and member.lifecycle else []
    )
    for k, window in enumerate(windows):
        for name in ("input_distribution", "output_distribution"):
            law = getattr(window, name)
            if law is not None:
                yield "length", law, f"lifecycle.windows[{k}].{name}"
    mm = member.multimodal
    if mm is not None:
        if mm.text_distribution is not None:
            yield "length", mm.text_distribution, "multimodal.text_distribution"
        for modality in ("image", "audio", "video"):
            count = getattr(mm, f"{modality}_count_distribution")
            size = getattr(mm, f"{modality}_distribution")
            if count is None or size is None:
                continue  # a modality needs both; one alone draws nothing
            yield "count", count, f"multimodal.{modality}_count_distribution"
            yield "length", size, f"multimodal.{modality}_distribution"
    if member.reasoning is not None and member.reasoning.reason_ratio_distribution is not None:
        yield (
            "ratio",
            member.reasoning.reason_ratio_distribution,
            ("reasoning.reason_ratio_distribution"),
        )


def check_length_laws(spec: WorkloadSpec, base_dir: Path | None = None, where: str = "") -> None:
    """Build every length law of the spec's clients and cohorts once, as a run would: a law
    the schema lets through but no sampler takes (a negative std_dev, min > max, a missing
    empirical file) is a ConfigError naming its place, `where` first (`compose` checks each
    source spec so, before merging). Sections a converter expands (servegen_data,
    inference_perf) are checked when they are run."""
    members = [(f"clients[{i}]", c) for i, c in enumerate(spec.clients)]
    members += [(f"cohorts[{k}]", c) for k, c in enumerate(spec.cohorts)]
    for place, member in members:
        for kind, law, path in _member_laws(member):
            at = f"{where}{place}.{path}"
            if kind == "ratio":
                ratio_from_dist_spec(law, base_dir, where=at)
            else:
                from_dist_spec(law, base_dir, minimum=0 if kind == "count" else 1, where=at)


def _check_expected_count(rate_per_s: float, horizon_us: int) -> None:
    """A workload bounded only by its horizon must not promise more requests than one run can
    hold (MAX_REQUESTS): rate x horizon is its expected size."""
    expected = rate_per_s * horizon_us / 1e6
    if expected > MAX_REQUESTS:
        raise ConfigError(
            f"workload: aggregate_rate {rate_per_s:,.6g} req/s over a horizon of "
            f"{horizon_us / 1e6:,.6g} s is about {expected:,.3g} requests; at most "
            f"{MAX_REQUESTS:,} per run (a run keeps every finished request): lower the rate "
            "or the horizon, or set num_requests"
        )


class WorkloadStream:
    """The requests of one workload, lazily, in arrival order, with IDs `request_<i>`."""

    def __init__(
        self,
        spec: WorkloadSpec,
        seed: int,
        horizon_us: int | None = None,
        base_dir: Path | None = None,
        where: str = "",
    ) -> None:
        """`where` names the spec in errors, before each field's path: `workload.` for a
        scenario's inline workload, `<file>: ` for a spec file."""
        given = spec
        spec, clients = resolve_clients(spec, base_dir)
        places = client_places(given, spec, len(clients), where)
        self.spec = spec
        self.seed = spec.seed if spec.seed is not None else seed
        self.horizon_us = horizon_us if horizon_us is not None else spec.horizon
        self.num_requests = spec.num_requests or None
        aggregate = spec.aggregate_rate or 0.0
        open_loop = [c for c in clients if not c.concurrency_users]
        total_fraction = sum(c.rate_fraction or 0.0 for c in open_loop)
        # Absolute rates: each period's trace_rate is its req/s; otherwise a trace_rate is the
        # period's weight among the clients' rate fractions, as a rate_fraction would be.
        absolute = not aggregate

        def period_rate(c: ClientSpec, w: ActiveWindow) -> float:
            if absolute:
                return w.trace_rate or 0.0
            return aggregate * ((w.trace_rate or c.rate_fraction or 0.0) / total_fraction)

        prefix = _prefix_lengths(clients)
        ids = [c.id or f"#{i}" for i, c in enumerate(clients)]
        id_counts = Counter(ids)
        # A client's random streams and content are keyed by its id; two clients given one id
        # (or a client named as a cohort's member) are still two independent sources, as in
        # BLIS, so a repeated id is told apart by its position.
        keys = [k if id_counts[k] == 1 else f"{k}#{i}" for i, k in enumerate(ids)]
        key_counts = Counter(keys)
        self.plans = []
        for i, c in enumerate(clients):
            windows = c.lifecycle.windows if c.lifecycle else []
            self.plans.append(
                ClientPlan(
                    index=i,
                    key=keys[i],
                    spec=c,
                    # BLIS's order of operations (the fraction normalised first), so that
                    # constant gaps land on the same µs (arrivals.ConstantArrivals).
                    rate_per_s=aggregate * (c.rate_fraction / total_fraction)
                    if c.rate_fraction and total_fraction
                    else 0.0,
                    prefix_length=prefix.get(c.prefix_group, 0),
                    windows=merged_windows(
                        (w.start_us, w.end_us) for w in windows if not w.overrides
                    ),
                    seed=self.seed,
                    base_dir=base_dir,
                    unique_key=key_counts[keys[i]] == 1,
                    period_windows=[
                        (k, w, period_rate(c, w)) for k, w in enumerate(windows) if w.overrides
                    ],
                    where=places[i],
                )
            )
        endless = not all(p.ends_by_itself for p in self.plans)
        if self.num_requests is None and self.horizon_us is None and endless:
            raise ConfigError(
                "workload: neither num_requests (0 or unset: no limit, as in BLIS) nor a "
                "horizon is set, so the traffic never ends; set workload num_requests >= 1 or "
                "horizon (µs)"
            )
        if self.num_requests is None and self.horizon_us is not None:
            _check_expected_count(aggregate, self.horizon_us)
        self.sessions = SessionManager(self.horizon_us)

    @property
    def has_sessions(self) -> bool:
        """Do requests of this workload follow others' completions (sessions, users)?"""
        return self.spec.has_sessions

    def _client_requests(self, plan: ClientPlan) -> Iterator[Keyed]:
        """One client's requests in arrival order, keyed for the merge: (arrival, client,
        order, request, the session a first round opens)."""
        mt = plan.multi_turn
        order = itertools.count()
        if mt is None:
            for t, period in plan.arrival_instants(self.horizon_us):
                yield (t, plan.index, next(order), plan.new_request(t, period=period), None)
            return
        pending: list[Keyed] = []  # open-loop rounds not yet due
        started = 0
        # BLIS's per-client cap: a client stops starting sessions once it has generated
        # 2 x num_requests rounds (every round of each session counts, placed or not). Only
        # sessions feel it: their later rounds sit far ahead in time, so without the cap the
        # cut at num_requests would start more sessions than BLIS (77 against 50).
        rounds_cap = None if self.num_requests is None else 2 * self.num_requests
        for t, period in plan.arrival_instants(self.horizon_us):
            while pending and pending[0][0] <= t:
                yield heapq.heappop(pending)
            if mt.single_session and started:
                # One session only: stop drawing arrivals (skipping them would never end
                # without a horizon); its remaining rounds are yielded below.
                break
            if rounds_cap is not None and started * mt.max_rounds >= rounds_cap:
                break
            session_id = f"sess_{plan.key}_{started}"
            started += 1
            first = plan.new_request(t, period=period)
            session = Session(session_id, plan, mt.max_rounds)
            # Registered by `__iter__` when `first` is sent: a session whose first round falls
            # past num_requests (the merge draws each client's next item ahead) never existed.
            yield (t, plan.index, next(order), first, session)
            if plan.closed_loop:
                # Later rounds come from the closed loop, but they count against num_requests
                # where open loop would place them, as in BLIS: it expands every round, cuts
                # the merged list at num_requests, then keeps the first rounds. Placeholders
                # (no request) hold those places in the merge.
                arrival, output = t, first.output_tokens
                for _ in range(1, mt.max_rounds):
                    arrival += mt.think_time_us + output
                    if self.horizon_us is not None and arrival >= self.horizon_us:
                        break
                    heapq.heappush(pending, (arrival, plan.index, next(order), None, None))
                    output = plan.planned_outputs.next()
                continue
            # Open loop: every round is known now; round r+1 follows round r by the think
            # time plus one µs per output token (BLIS-Mar's spacing rule, docs/behaviour.md §9.3).
            rounds = [first]
            prev, arrival = first, t
            for r in range(1, mt.max_rounds):
                arrival = arrival + mt.think_time_us + prev.output_tokens
                if self.horizon_us is not None and arrival >= self.horizon_us:
                    break
                nxt = plan.new_request(arrival, plan.next_round_context(prev, prev.output_tokens))
                nxt.session_id, nxt.round_index = session_id, r
                heapq.heappush(pending, (arrival, plan.index, next(order), nxt, None))
                rounds.append(nxt)
                prev = nxt
            session.rounds = rounds
        while pending:
            yield heapq.heappop(pending)

    def __iter__(self) -> Iterator[Request]:
        users = [p for p in self.plans if p.spec.concurrency_users]
        open_loop = (self._client_requests(p) for p in self.plans if not p.spec.concurrency_users)
        merged: Iterable = heapq.merge(*open_loop)
        limit = self.num_requests
        if users:
            merged = self._with_users(merged, users, limit)
        clock_end = MAX_TIME_US
        i = 0
        for place, (t, index, _, req, session) in enumerate(merged):
            if limit is not None and place >= limit:
                return
            if req is None:  # a closed-loop round's place (`_client_requests`)
                continue
            if session is not None:  # a session's first request: the session now exists
                self.sessions.register(req, session)
            # Every time a generated request carries (its arrival, its deadline) must be on
            # the clock; closed-loop rounds are checked where they are made.
            if t > clock_end or req.deadline_us > clock_end:
                self._beyond_clock(i, self.plans[index % len(self.plans)], req)
            req.request_id = f"request_{i}"
            req.index = i
            i += 1
            yield req

    def _with_users(
        self, merged: Iterable, users: list[ClientPlan], limit: int | None
    ) -> Iterator[Keyed]:
        """The open-loop requests with each closed-loop user's first request, as BLIS does:
        open-loop requests first take their share of num_requests (so they are generated up
        front), users then start while requests are left, and what remains after that is the
        users' follow-up budget. A user's first request sorts after open-loop requests of the
        same instant."""
        from .closed_loop import user_sessions

        if limit is not None:
            merged = list(itertools.islice(merged, limit))
        left = None if limit is None else limit - len(merged)
        firsts = []
        for plan in users:
            for arrival, u, req, session in user_sessions(plan, self.seed, left):
                # Ranked after every client index: open-loop requests come first at a tie.
                # The session is registered when `__iter__` sends the request.
                firsts.append((arrival, len(self.plans) + plan.index, u, req, session))
            if left is not None:
                left -= min(left, plan.spec.concurrency_users)
        self.sessions.follow_up_budget = left
        firsts.sort(key=lambda x: (x[0], x[1], x[2]))
        return heapq.merge(merged, firsts)

    def _beyond_clock(self, i: int, plan: ClientPlan, req: Request) -> None:
        if req.arrival_us > MAX_TIME_US:
            # No horizon (it is on the clock and ends every stream), so the rate and the
            # request count decide how far the arrivals reach.
            rate = self.spec.aggregate_rate
            causes = [
                f"rate (aggregate_rate) {rate:g} requests/s" if rate else "rate",
                f"num_requests {self.num_requests}" if self.num_requests else "no num_requests",
            ]
            if plan.multi_turn is not None:
                causes.append(f"think_time_us {plan.multi_turn.think_time_us}")
            check_time_us(
                req.arrival_us,
                f"workload ({', '.join(causes)}, no horizon): request {i}, from client "
                f"{plan.key!r} at {plan.rate_per_s:g} requests/s, arrives",
            )
        plan.check_deadline(req)
