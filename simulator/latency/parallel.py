"""How one instance lays a model over its GPUs (docs/parallelism.md): tensor, pipeline, data
and expert parallelism, and the links between the GPUs they use.

An instance is `dp` data-parallel attention ranks, each `pp` pipeline stages of `tp`
tensor-parallel GPUs: tp·pp·dp GPUs in all. Expert parallelism does not add GPUs: `ep` of
them (within one stage, across its TP GPUs and DP ranks) hold the routed experts as whole
experts instead of every GPU holding a slice of each. Here `ep` = 1 means no expert
parallelism; vLLM's `--enable-expert-parallel` is `ep` = tp·dp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from simulator.catalog.types import GPUSpec, ModelConfig
from simulator.errors import invalid

_DATA = Path(__file__).resolve().parent.parent / "catalog" / "data" / "physics.yaml"


def _whole(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(field, value, "must be an integer >= 1")
    return value


@dataclass(frozen=True)
class Parallelism:
    """One instance's layout: tp GPUs per stage, pp stages, dp attention ranks, experts
    sharded whole over ep GPUs (1 = sliced by TP instead)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1

    @classmethod
    def of(
        cls,
        tp: int,
        pp: int | None = None,
        dp: int | None = None,
        ep: int | None = None,
        enable_expert_parallel: bool = False,
    ) -> Parallelism:
        """A layout from the user's options; `enable_expert_parallel` means ep = tp·dp (as in
        vLLM) and may be combined with an `ep` only when the two agree."""
        tp = _whole("tp", tp)
        pp = _whole("pp", 1 if pp is None else pp)
        dp = _whole("dp", 1 if dp is None else dp)
        if ep is not None:
            _whole("ep", ep)
        if enable_expert_parallel:
            if ep is not None and ep != tp * dp:
                raise invalid(
                    "ep",
                    ep,
                    f"enable_expert_parallel shards experts over tp x dp = {tp * dp} GPUs; "
                    "give ep or enable_expert_parallel, or make them agree",
                )
            ep = tp * dp
        return cls(tp, pp, dp, 1 if ep is None else ep)

    @property
    def gpus(self) -> int:
        """GPUs the instance occupies: tp·pp·dp (expert parallelism reuses them)."""
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_rank(self) -> int:
        return self.tp * self.pp

    @property
    def experts_tensor_parallel_over_ranks(self) -> bool:
        """DP ranks without expert parallelism across them: vLLM's default for an MoE model
        served with data parallelism, whose expert layers form one tensor-parallel group of
        tp x dp GPUs (each holds a 1/(tp·dp) slice of every expert and computes it for every
        rank's tokens, gathered before the layer and reduce-scattered after it)."""
        return self.dp > 1 and self.ep <= self.tp

    @property
    def expert_shards(self) -> int:
        """Each GPU of a stage holds 1/expert_shards of the routed-expert weights: a slice of
        every expert (TP, over the ranks too with DP) or whole experts (EP)."""
        if self.experts_tensor_parallel_over_ranks:
            return self.tp * self.dp
        return max(self.tp, self.ep)

    @property
    def ep_ranks(self) -> int:
        """DP ranks whose tokens one group of expert GPUs serves: every rank when the experts
        are sliced over all of them, ep/tp with expert parallelism across ranks, else 1."""
        if self.experts_tensor_parallel_over_ranks:
            return self.dp
        return max(1, self.ep // self.tp)

    def expert_group_gpus(self, stage: int = 0) -> list[int]:
        """The GPUs whose expert layers of pipeline stage `stage` exchange tokens: that stage's
        tp GPUs in each of the `ep_ranks` ranks, numbered as vLLM places them (rank by rank,
        stage by stage within a rank, tp GPUs per stage)."""
        stride = self.pp * self.tp
        start = stage * self.tp
        return [r * stride + start + t for r in range(self.ep_ranks) for t in range(self.tp)]

    @property
    def is_trivial(self) -> bool:
        return self.pp == 1 and self.dp == 1 and self.ep == 1

    def describe(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "gpus": self.gpus}

    def check(self, model: ModelConfig) -> Parallelism:
        """Refuse layouts the model cannot take, naming the option and what is allowed."""
        if self.pp > model.num_layers:
            raise invalid(
                "pp",
                self.pp,
                f"must be at most the {model.num_layers} layers of model {model.name!r}",
            )
        if self.ep == 1:
            return self
        if not model.is_moe:
            raise invalid(
                "ep",
                self.ep,
                f"expert parallelism needs an MoE model; {model.name!r} is dense (use 1)",
            )
        group = self.tp * self.dp
        if group % self.ep or (self.ep % self.tp and self.tp % self.ep):
            raise invalid(
                "ep",
                self.ep,
                f"must divide tp x dp = {group} and divide or be a multiple of tp = {self.tp}",
            )
        if self.dp > 1 and self.ep <= self.tp:
            # With DP ranks the expert layers span them: sliced over tp x dp (ep 1), or whole
            # experts over a multiple of tp; EP inside each rank is no vLLM layout.
            raise invalid(
                "ep",
                self.ep,
                f"with dp = {self.dp} the expert layers span the ranks: 1 (each expert sliced "
                f"over tp x dp = {group} GPUs, vLLM's default) or a multiple of tp = {self.tp} "
                f"above it (whole experts across ranks; enable_expert_parallel gives {group})",
            )
        if model.num_local_experts % self.ep:
            raise invalid(
                "ep",
                self.ep,
                f"must divide the {model.num_local_experts} experts of model {model.name!r}",
            )
        return self


def stage_layer_ranges(num_layers: int, pp: int) -> list[range]:
    """vLLM's split of layers over pipeline stages: ⌊L/pp⌋ each, the remainder going one
    layer apiece to the stages before the last (which also runs the LM head)."""
    counts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        counts[-i] += 1
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


@cache
def _tables() -> dict[str, Any]:
    from simulator.input_files import bundled_yaml

    return bundled_yaml(_DATA.read_text(encoding="utf-8"))


def _lookup(table: str, gpu: GPUSpec) -> Any:
    values = _tables()[table]
    return values.get(gpu.name, values["default"])


@dataclass(frozen=True)
class Links:
    """The GPU-to-GPU links of one GPU type: per-direction bandwidths (GB/s) and how many
    GPUs share the fast one."""

    scale_up_gb_per_s: float  # NVLink / Infinity Fabric (PCIe without them), within a domain
    scale_out_gb_per_s: float  # the GPU's network card (RDMA), between domains
    domain_gpus: int  # GPUs on one scale-up fabric: a node (8), a GB200 NVL72 rack (72)

    def crosses(self, first_gpu: int, last_gpu: int) -> bool:
        """Do GPUs numbered first..last (placed in order, domain by domain) span domains?"""
        return first_gpu // self.domain_gpus != last_gpu // self.domain_gpus

    def member_peers(self, gpus: Sequence[int]) -> list[tuple[int, int]]:
        """Per scale-up domain `gpus` (numbered in placement order, domain by domain) span,
        in the order they first appear: (peers on the same fabric, peers across the network)
        of a member there."""
        counts = Counter(g // self.domain_gpus for g in gpus)
        return [(members - 1, len(gpus) - members) for members in counts.values()]

    def exchange_s(self, groups: Sequence[Sequence[int]], bytes_per_peer: float) -> float:
        """Seconds for every member of each group to send `bytes_per_peer` to every other
        member of its group: the slowest member's time, its same-domain peers over the
        scale-up link and the rest over the network at once (either link may be the slower)."""
        worst = 0.0
        for gpus in groups:
            for local, remote in self.member_peers(gpus):
                worst = max(
                    worst,
                    bytes_per_peer * local / (self.scale_up_gb_per_s * 1e9),
                    bytes_per_peer * remote / (self.scale_out_gb_per_s * 1e9),
                )
        return worst

    def crosses_domains(self, gpus: Sequence[int]) -> bool:
        """Do `gpus` sit on more than one scale-up fabric?"""
        return len({g // self.domain_gpus for g in gpus}) > 1


def links_for(gpu: GPUSpec) -> Links:
    """The bundled link figures for a GPU type (simulator/catalog/data/physics.yaml)."""
    return Links(
        float(_lookup("interconnect_gb_per_s", gpu)),
        float(_lookup("scale_out_gb_per_s", gpu)),
        int(_lookup("scale_up_domain_gpus", gpu)),
    )


__all__ = ["Links", "Parallelism", "links_for", "stage_layer_ranges"]
