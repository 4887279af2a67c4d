"""Closed-loop load: virtual users who send their next request a think time after their
previous one finished (docs/workloads.md, "Closed-loop load").

Two sources, both following current BLIS:

* **Concurrency clients** (`clients[].concurrency: N` with `think_time_us`, or `run
  --concurrency N --think-time-ms T`): N users per client. User u sends its first request at
  u·T/N (integer µs; all at 0 when T = 0 or N = 1), then each next one at the end of the step
  that produced its previous request's last token, plus T. The users never stop on their own:
  the workload's `num_requests` caps the whole run (first requests plus follow-ups), or its
  horizon ends it.
* **Closed-loop replay** of a trace's sessions (`replay --session-mode closed-loop`): round 0
  of each session is sent at its recorded time; round r + 1 follows round r's end by a think
  time, with the lengths the trace recorded for that round.

A user has at most one request outstanding, so requests in flight never exceed the number of
users, and a queue can never hold more than that: a closed-loop run cannot be overloaded into
an unbounded queue, it only slows its users down.

Everything here is plain Python called back by the simulation (`SessionManager.on_finished`);
no SimPy process per user is needed, since a user only acts when its request finishes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..engine.request import Request, RequestState
from ..errors import ConfigError, excerpt
from ..limits import MAX_TIME_US, check_time_us
from ..rng import stream_seed
from .spec import DEFAULT_SESSION_TIMEOUT_US

if TYPE_CHECKING:
    from .generator import ClientPlan, SessionManager
    from .trace import TraceRow


# --- think times ------------------------------------------------------------------------------

_UNITS_US = {"us": 1, "µs": 1, "ms": 1_000, "s": 1_000_000}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)?\s*$")


def parse_duration_us(text: str, where: str) -> int:
    """A time such as `500ms`, `3s`, `250us` or `250` (µs) as whole µs."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigError(
            f"{where}: invalid time {excerpt(text)}; expected a number with an optional unit "
            "us, ms or s (e.g. 500ms)"
        )
    value_us = float(match.group(1)) * _UNITS_US[match.group(2) or "us"]
    if not math.isfinite(value_us) or value_us > MAX_TIME_US:
        raise ConfigError(f"{where}: time {excerpt(text)} is beyond the clock (2^53 µs)")
    return round(value_us)


class ThinkTime:
    """How long a user waits between a response and its next request (µs, whole)."""

    def sample_us(self, rng: np.random.Generator) -> int:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class ConstantThink(ThinkTime):
    value_us: int

    def sample_us(self, rng: np.random.Generator) -> int:
        return self.value_us

    def describe(self) -> str:
        return f"constant {self.value_us} µs"


@dataclass(frozen=True)
class LognormalThink(ThinkTime):
    """exp(mu + sigma·Z) seconds (mu, sigma in ln-seconds, as BLIS), rounded to whole µs,
    clamped to [min_us, max_us] and at least 1 µs."""

    mu: float
    sigma: float
    min_us: int | None = None
    max_us: int | None = None

    def sample_us(self, rng: np.random.Generator) -> int:
        value = math.exp(self.mu + math.log(1e6) + self.sigma * rng.standard_normal())
        value = min(round(min(value, float(MAX_TIME_US))), MAX_TIME_US)
        if self.min_us is not None:
            value = max(value, self.min_us)
        if self.max_us is not None:
            value = min(value, self.max_us)
        return max(1, value)

    def describe(self) -> str:
        bounds = "".join(
            f", {name} {v} µs"
            for name, v in (("min", self.min_us), ("max", self.max_us))
            if v is not None
        )
        return f"lognormal mu {self.mu:g}, sigma {self.sigma:g} (ln s){bounds}"


_THINK_KEYS = {"constant": ({"value"}, set()), "lognormal": ({"mu", "sigma"}, {"min", "max"})}


def parse_think_time(text: str, where: str = "--think-time-dist") -> ThinkTime:
    """BLIS's think-time syntax: `constant:value=<t>` or
    `lognormal:mu=<μ>,sigma=<σ>[,min=<t>][,max=<t>]` (μ, σ in ln-seconds; times with an
    optional unit us, ms or s, plain numbers being µs)."""
    kind, sep, rest = text.strip().partition(":")
    if not sep or kind not in _THINK_KEYS:
        raise ConfigError(
            f"{where}: invalid value {excerpt(text)}; expected constant:value=<time> or "
            "lognormal:mu=<ln s>,sigma=<ln s>[,min=<time>][,max=<time>]"
        )
    params: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{where}: invalid parameter {excerpt(part)}; expected key=value")
        if key in params:
            raise ConfigError(f"{where}: parameter {key!r} given twice")
        params[key] = value.strip()
    needed, optional = _THINK_KEYS[kind]
    missing = sorted(needed - set(params))
    unknown = sorted(set(params) - needed - optional)
    if missing or unknown:
        problem = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        raise ConfigError(
            f"{where}: {kind}: {problem}; parameters: {', '.join(sorted(needed | optional))}"
        )
    if kind == "constant":
        return ConstantThink(parse_duration_us(params["value"], f"{where}: value"))
    numbers = {}
    for key in ("mu", "sigma"):
        try:
            numbers[key] = float(params[key])
        except ValueError:
            raise ConfigError(
                f"{where}: {key}: invalid value {excerpt(params[key])}; expected a number"
            ) from None
        if not math.isfinite(numbers[key]):
            raise ConfigError(f"{where}: {key}: must be finite, got {params[key]}")
    if numbers["sigma"] < 0:
        raise ConfigError(f"{where}: sigma: invalid value {params['sigma']}; must be >= 0")
    lo = parse_duration_us(params["min"], f"{where}: min") if "min" in params else None
    hi = parse_duration_us(params["max"], f"{where}: max") if "max" in params else None
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"{where}: min ({lo} µs) must be <= max ({hi} µs)")
    return LognormalThink(numbers["mu"], numbers["sigma"], lo, hi)


# --- sessions ---------------------------------------------------------------------------------


def follow_up_id(session_id: str, round_index: int, k: int) -> str:
    """BLIS's name of a closed-loop follow-up: the session, its round and a run-wide count."""
    return f"session_{session_id}_round_{round_index}_{k}"


@dataclass
class UserSession:
    """One virtual user of a concurrency client."""

    session_id: str
    plan: ClientPlan
    think: ThinkTime
    rng: np.random.Generator
    rounds_done: int = 0
    outcome: str = ""  # completed | cancelled | horizon_interrupted | budget_exhausted
    rounds: list[Request] = field(default_factory=list)  # open-loop rounds: none here

    def follow_up(self, req: Request, tick_us: int, manager: SessionManager) -> Request | None:
        """The next request after `req` finished at `tick_us`, or None (and an outcome)."""
        if req.state is not RequestState.COMPLETED:
            self.outcome = "cancelled"  # timed out, dropped or rejected: the user gives up
            return None
        self.rounds_done += 1
        if not manager.budget_left():
            self.outcome = "budget_exhausted"
            return None
        think_us = self.think.sample_us(self.rng)
        arrival = tick_us + think_us
        if manager.horizon_us is not None and arrival > manager.horizon_us:
            self.outcome = "horizon_interrupted"
            return None
        if arrival > MAX_TIME_US:
            check_time_us(
                arrival,
                f"client {self.plan.key!r}: think_time_us ({think_us}): request "
                f"{self.rounds_done} of {self.session_id}, after {tick_us} µs, arrives",
            )
        nxt = self.plan.new_request(arrival)
        if nxt.deadline_us > MAX_TIME_US:
            self.plan.check_deadline(nxt)
        return manager.name_follow_up(nxt, self.session_id, self.rounds_done)


def user_sessions(
    plan: ClientPlan, seed: int, limit: int | None
) -> list[tuple[int, int, Request, UserSession]]:
    """The first request of each of a concurrency client's users, with its session:
    (arrival, user, request, session), at most `limit` of them (None = all)."""
    users = plan.spec.concurrency_users
    think_us = plan.spec.think_time_us
    client_id = plan.spec.id or plan.key
    out = []
    for u in range(users):
        if limit is not None and u >= limit:
            break
        # Users start spread over one think time, so they do not all arrive at once.
        arrival = u * think_us // users if think_us > 0 and users > 1 else 0
        req = plan.new_request(arrival)
        session = UserSession(
            f"concurrency_{client_id}_user_{u}",
            plan,
            ConstantThink(think_us),
            stream_seed(seed, "client", plan.key, f"user.{u}.think"),
        )
        out.append((arrival, u, req, session))
    return out


@dataclass
class ReplaySession:
    """One session of a trace replayed closed-loop: its later rounds wait for the earlier."""

    session_id: str
    templates: list[Request]  # every round, built from its trace row (round 0 is injected)
    thinks: list[ThinkTime | None]  # per round >= 1 (index r): its think time
    accumulate: bool
    rng: np.random.Generator
    rounds_done: int = 0
    outcome: str = ""
    rounds: list[Request] = field(default_factory=list)

    def follow_up(self, req: Request, tick_us: int, manager: SessionManager) -> Request | None:
        if req.state is not RequestState.COMPLETED:
            self.outcome = "cancelled"
            return None
        self.rounds_done += 1
        if self.rounds_done >= len(self.templates):
            self.outcome = "completed"
            return None
        r = self.rounds_done
        think = self.thinks[r]
        arrival = tick_us + (think.sample_us(self.rng) if think is not None else 0)
        if manager.horizon_us is not None and arrival > manager.horizon_us:
            self.outcome = "horizon_interrupted"
            return None
        check_time_us(arrival, f"session {self.session_id!r}: round {r} arrives")
        nxt = self.templates[r]
        nxt.arrival_us = arrival
        # Recorded deadlines belong to the recorded arrivals: a follow-up gets BLIS's session
        # default instead, counted from its new arrival.
        nxt.deadline_us = arrival + DEFAULT_SESSION_TIMEOUT_US
        if self.accumulate:
            own = nxt.input_tokens
            context = [*req.segments, (req.output_key, req.generated_tokens)]
            nxt.segments = [*context, *nxt.segments]
            nxt.input_tokens = own + sum(n for _, n in context)
            nxt.prefill_target = nxt.input_tokens
        return manager.name_follow_up(nxt, self.session_id, r)


def replay_sessions(
    rows: list[TraceRow],
    requests: list[Request],
    think: ThinkTime | None,
    accumulate: bool,
    seed: int,
) -> tuple[list[Request], list[ReplaySession]]:
    """Split a trace's requests (built row by row) for closed-loop replay: the ones injected
    at their recorded times (rows without a session, and each session's round 0), and the
    sessions that send the rest.

    A session's rows must carry rounds 0..n-1, each once. Round r's think time: `think` when
    given; else the recorded `think_time_us` column, when the session has a non-zero one for
    some round >= 1; else the recorded gap between the two rounds' arrivals (at least 0)."""
    by_session: dict[str, list[tuple[TraceRow, Request]]] = {}
    injected: list[Request] = []
    for row, req in zip(rows, requests, strict=True):
        if row.session_id:
            by_session.setdefault(row.session_id, []).append((row, req))
        else:
            injected.append(req)
    sessions = []
    for session_id, members in by_session.items():
        members.sort(key=lambda m: m[0].round_index)
        found = [row.round_index for row, _ in members]
        if found != list(range(len(members))):
            raise ConfigError(
                f"trace data: session {excerpt(session_id)}: rounds {_rounds(found)}; "
                f"closed-loop replay needs rounds 0..{len(members) - 1}, each once"
            )
        rows_s = [row for row, _ in members]
        recorded = any(row.think_time_us for row in rows_s[1:])
        thinks: list[ThinkTime | None] = [None]
        for r in range(1, len(rows_s)):
            if think is not None:
                thinks.append(think)
            elif recorded:
                thinks.append(ConstantThink(rows_s[r].think_time_us or 0))
            else:
                gap = rows_s[r].arrival_time_us - rows_s[r - 1].arrival_time_us
                thinks.append(ConstantThink(max(0, gap)))
        templates = [req for _, req in members]
        if accumulate:
            # Each round's prompt and output reappear in the next round's prompt: none of its
            # content is private (KV blocks must be hashed to be found again).
            for template in templates:
                template.private_from_token = -1
        injected.append(templates[0])
        sessions.append(
            ReplaySession(
                session_id,
                templates,
                thinks,
                accumulate,
                stream_seed(seed, "replay-session", session_id),
            )
        )
    injected.sort(key=lambda r: (r.arrival_us, r.index))
    return injected, sessions


def _rounds(found: list[int], most: int = 8) -> str:
    text = ", ".join(str(r) for r in found[:most])
    return text + (", …" if len(found) > most else "")
