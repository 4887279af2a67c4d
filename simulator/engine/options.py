"""Which exact accelerations a run uses (docs/engine.md "Reference path and accelerations").

Every acceleration gives byte-identical results to the reference path, where each request is
handled one at a time, every step has its own SimPy event and every finished request stays an
object; tests/engine/test_fast_paths.py runs random engines and clusters both ways. The
reference path is there to check the accelerations against, and for a contributor to read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class EngineOptions:
    """`EngineOptions()` is the accelerated default; `EngineOptions(reference=True)` turns every
    acceleration off. Single switches exist for tests that isolate one of them."""

    reference: bool = False
    # Decoding requests that need nothing but a counter advance are handled as a group
    # (accelerator.SteadyDecoders).
    decode_fast_path: bool = True
    # An instance finishes its own quiet steps without a SimPy event each
    # (accelerator.finish_quiet_steps).
    coalesce_steps: bool = True
    # A request's private prompt blocks are hashed only when a release needs them (KVCache).
    defer_private_hashes: bool = True
    # Prefix-affinity scoring counts a request's private blocks instead of hashing them.
    private_blocks_by_count: bool = True
    # Finished requests become compact rows (metrics/request_table.py); PD keeps objects.
    compact_finished_requests: bool = True

    def __post_init__(self) -> None:
        if self.reference:
            for field in fields(self):
                if field.name != "reference":
                    object.__setattr__(self, field.name, False)


ACCELERATED = EngineOptions()
REFERENCE = EngineOptions(reference=True)
