"""Which inter-token gaps the pooled ITL holds: those of requests that complete.

vLLM's benchmark and BLIS pool the gaps of successful requests only. An engine does not store
gaps per request: a step's regular gap is counted once for every request that also got a
token in the step before (metrics/recorder.py), and only the irregular ones (a request that
missed steps: preempted, waiting for a reload) are listed. So a request that leaves an engine
without completing (its client timed out, its instance was drained or failed, or the run
ended first) is *withdrawn*: the engine notes where its tokens came from in the step log, and
the summary takes those gaps back out of the pool (metrics/summary.py: `pooled_itl_us`).

A request's tokens come in runs of consecutive steps. A run starts at the row of its first
token or of the token after a break, and ends at the step of the last token before the next
break; every row after its first up to its last gave the request one regular gap. Each break
itself is one irregular gap. What is left (tokens past the first of a speculative burst) is a
gap of the output-token processing time each.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from .request import Request


def note_break(req: Request, previous_step_end_us: float, row: int, gap_us: float) -> None:
    """`req` got a token at step-log row `row` after missing steps: the run before ended at
    the step that ended at `previous_step_end_us`, and the token came `gap_us` after the last."""
    breaks = req.itl_breaks
    if breaks is None:
        req.itl_breaks = [(previous_step_end_us, row, gap_us)]
    else:
        breaks.append((previous_step_end_us, row, gap_us))


@dataclass(frozen=True, slots=True)
class WithdrawnGaps:
    """The gaps of the requests an engine withdrew, as runs of step-log rows.

    Run i started at row `run_start_rows[i]` and its last token came at the step ending at
    `run_last_end_us[i]`; `irregular_itl_us` are the breaks between runs; `gap_count` counts
    every gap of the withdrawn requests (a request with n tokens had n - 1)."""

    run_start_rows: array
    run_last_end_us: array
    irregular_itl_us: array
    gap_count: int


class WithdrawnGapLog:
    """An engine's record of the requests that left it without completing."""

    __slots__ = ("otp_us", "_start_rows", "_last_end_us", "_irregular_us", "_gap_count")

    def __init__(self, otp_us: int) -> None:
        self.otp_us = otp_us
        self._start_rows = array("q")
        self._last_end_us = array("d")
        self._irregular_us = array("d")
        self._gap_count = 0

    def withdraw(self, req: Request) -> None:
        """`req` leaves the engine without completing; its counters must be exact (synced)."""
        self._gap_count += self._add(req, self._start_rows, self._last_end_us, self._irregular_us)
        req.first_token_row = -1  # withdrawn once, however often asked
        req.itl_breaks = None

    def _add(self, req: Request, start_rows: array, last_end_us: array, irregular: array) -> int:
        generated = req.generated_tokens
        if generated < 2 or req.first_token_row < 0:
            return 0
        start_rows.append(req.first_token_row)
        for previous_end_us, row, gap_us in req.itl_breaks or ():
            last_end_us.append(previous_end_us)
            irregular.append(gap_us)
            start_rows.append(row)
        # Token k reached the client at (its step's end) + k * otp (docs/behaviour.md §A3).
        last_end_us.append(req.last_token_us - generated * self.otp_us)
        return generated - 1

    def snapshot(self, unfinished: Iterable[Request]) -> WithdrawnGaps:
        """What was withdrawn, and the requests still in the engine as if withdrawn now (at
        the end of the run they did not complete), without changing the log."""
        start_rows = array("q", self._start_rows)
        last_end_us = array("d", self._last_end_us)
        irregular = array("d", self._irregular_us)
        gap_count = self._gap_count
        for req in unfinished:
            gap_count += self._add(req, start_rows, last_end_us, irregular)
        return WithdrawnGaps(start_rows, last_end_us, irregular, gap_count)
