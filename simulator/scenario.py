"""The Scenario schema: one YAML file describes a whole run.

Validation is strict (unknown keys are errors) and happens before anything runs, so a typo
fails fast with the field's dotted path, the value and what is allowed. Every number has the
range of its kind (instances, tokens, µs, ...; simulator/limits.py), and no string or boolean
is read as a number, nor anything but true/false as a flag.
"""

# Annotations are evaluated as written (no `from __future__ import annotations`): pydantic
# would otherwise compile and evaluate each field's annotation text when the class is
# created, a cost every run pays at start-up (docs/performance.md, "Start-up").
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    SerializationInfo,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from .cluster.infra_spec import (
    AutoscalerSpec,
    DeploymentSpec,
    EventSpec,
    LifecycleSpec,
    NodePoolSpec,
)
from .engine.preemption import SLO_CLASS_PRIORITY, SLO_PRIORITY_BOUND
from .errors import ConfigError, excerpt, require_path
from .input_files import read_yaml_mapping
from .limits import (
    MAX_INSTANCES,
    MAX_NODES,
    Bandwidth,
    Blocks,
    BlockSize,
    BytesPerToken,
    Coefficient,
    Flag,
    Gpus,
    Instances,
    Milliseconds,
    PositiveBlocks,
    PositiveInstances,
    PositiveRequests,
    PositiveTimeUs,
    PositiveTokens,
    Rate,
    Requests,
    Seed,
    SloTargetMs,
    TimeUs,
    TokenAmount,
    TokenBucketTokens,
    TokenRate,
    Tokens,
    TransferSlots,
    empty_list,
    integer,
    number,
)
from .lora_setup import LoRASpec
from .speculative_setup import SpeculativeSpec
from .workload.spec import V2_ONLY_KEYS, format_spec_error
from .workload.spec import WorkloadSpec as V2WorkloadSpec


class _Strict(BaseModel):
    # Schemas are built on first use: a run validates only the models it uses. No protected
    # namespaces: `model_config_folder` is BLIS's name, and pydantic before 2.10 warns on
    # every run about fields starting with "model_".
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, defer_build=True, protected_namespaces=()
    )


_MemoryFraction = number(0, 1, "", "a fraction of the GPU's memory", lo_open=True)


# The gaussian fields' former defaults, as a dumped constant law carried them.
_GAUSSIAN_DEFAULTS_WRITTEN = {"mean": 512, "stdev": 256, "min": 2, "max": 7000}


class LengthSpec(_Strict):
    """A token-length distribution: gaussian (clamped to [min, max]) or constant.

    A gaussian field left None is the preset's (`workload.preset`), else 512 / 256 / 2 / 7000
    (`presets.DISTRIBUTION_DEFAULTS`): None rather than those numbers, so that a dump of the
    scenario (a result's `scenario`) read back still tells a given field from a default."""

    distribution: Literal["gaussian", "constant"] = "gaussian"
    mean: TokenAmount | None = None
    stdev: TokenAmount | None = None
    min: PositiveTokens | None = None
    max: PositiveTokens | None = None
    value: Tokens | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_written_defaults(cls, data: Any) -> Any:
        # Scenarios dumped before 2026-12-07 (a saved result's `scenario`) wrote a constant
        # law with the gaussian defaults filled in; those are not fields a user gave.
        if isinstance(data, dict) and data.get("distribution") == "constant":
            data = {
                k: v
                for k, v in data.items()
                if not (k in _GAUSSIAN_DEFAULTS_WRITTEN and v == _GAUSSIAN_DEFAULTS_WRITTEN[k])
            }
        return data

    @model_validator(mode="after")
    def _check(self) -> "LengthSpec":
        # A field of the other law would run ignored (`{value: 10}` gave N(512, 256) lengths).
        if self.distribution == "constant":
            if self.value is None:
                raise ValueError("constant distribution needs `value`")
            for name in ("mean", "stdev", "min", "max"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}: invalid value {getattr(self, name)!r}; it applies to "
                        "distribution gaussian (a constant length has only `value`)"
                    )
        else:
            if self.value is not None:
                raise ValueError(
                    f"value: invalid value {self.value!r}; it applies to distribution constant "
                    "(write `distribution: constant`)"
                )
            # A bound not given comes from a preset (synthetic.py), which checks the merged law.
            if self.min is not None and self.max is not None and self.min > self.max:
                raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class SyntheticWorkload(_Strict):
    """BLIS's preset / distribution mode: one client, one arrival process, two length laws.

    With `preset`, the preset's lengths apply unless prompt_tokens / output_tokens are given.
    """

    preset: str | None = None
    arrival: Literal["poisson", "constant"] = "poisson"
    rate: Rate = Field(1.0, description="requests per second")
    num_requests: PositiveRequests = 100
    prefix_tokens: Tokens = Field(0, description="shared prefix length (one group)")
    prompt_tokens: LengthSpec | None = None
    output_tokens: LengthSpec | None = None
    timeout_us: TimeUs = Field(0, description="client deadline after arrival; 0 = none")
    # Closed loop (BLIS --concurrency): this many virtual users, each sending its next request
    # think_time_us after its previous one finished; `rate` and `arrival` then do not apply.
    concurrency: Requests = Field(0, description="virtual users; 0 = open loop at `rate`")
    think_time_us: TimeUs = 0

    @model_validator(mode="after")
    def _think_time_needs_users(self) -> "SyntheticWorkload":
        # Refused as --think-time-ms without --concurrency is: an open loop has no think time,
        # and the setting ran ignored.
        if self.think_time_us and not self.concurrency:
            raise ValueError(
                f"think_time_us: invalid value {self.think_time_us}; it applies to closed-loop "
                "users: set concurrency"
            )
        return self


def _workload_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "v2" if V2_ONLY_KEYS & set(value) else "synthetic"
    return "v2" if isinstance(value, V2WorkloadSpec) else "synthetic"


WorkloadField = Annotated[
    Annotated[SyntheticWorkload, Tag("synthetic")] | Annotated[V2WorkloadSpec, Tag("v2")],
    Discriminator(_workload_kind),
]


class TraceSpec(_Strict):
    """Replay recorded requests: a BLIS TraceV2 pair, or a plain request CSV without header.

    `timing`: inject each row at its recorded send time (`sends`, BLIS's replay) or at its
    scheduled arrival_time_us (`schedule`). `max_in_flight`: the load generator's cap on
    outstanding requests; a request due while that many are outstanding is sent when one
    finishes, and its latencies count from that send (docs/traces.md)."""

    header: Path | None = None
    data: Path
    timing: Literal["sends", "schedule"] = "sends"
    max_in_flight: PositiveRequests | None = None
    # `closed-loop`: only each session's round 0 is sent at its time; round r + 1 follows
    # round r's end by a think time (docs/workloads.md). `think_time`: BLIS's think-time syntax
    # (`constant:value=500ms`, `lognormal:mu=..,sigma=..[,min=..][,max=..]`); None = the
    # trace's recorded think times, else its arrival gaps.
    session_mode: Literal["fixed", "closed-loop"] = "fixed"
    think_time: str | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _think_time_needs_closed_loop(self) -> "TraceSpec":
        # The fixed mode sends every row at its recorded time: a think time would be ignored.
        if self.think_time is not None and self.session_mode != "closed-loop":
            raise ValueError(
                f"think_time: invalid value {self.think_time!r}; it applies to session_mode "
                "closed-loop (the fixed mode sends every row at its recorded time)"
            )
        return self


# The step-time model of a run that names none: physics with the shipped fit for its GPU and
# vLLM version (docs/latency-models.md); BLIS's own backends are chosen by name.
DEFAULT_LATENCY_MODEL = "physics"


class LatencySpec(_Strict):
    model: str = DEFAULT_LATENCY_MODEL
    alpha_coeffs: list[Coefficient] | None = None
    beta_coeffs: list[Coefficient] | None = None
    # A release name such as "v0.8.4" or "0.15.1": long text is a mistake, not a version.
    vllm_version: str | None = Field(None, max_length=64)
    # Fitted coefficients written by `servesim calibrate` (latency model physics).
    coeffs_file: Path | None = None

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _version_is_text(cls, value: Any) -> Any:
        # An unquoted 0.23 reaches here as a float; its text is no safe version (YAML reads
        # 0.10 as 0.1), so the author is asked to quote it rather than have it converted.
        if isinstance(value, int | float) and not isinstance(value, bool):
            # The number may have lost digits already (0.10 arrives as 0.1): no version is
            # suggested from it.
            raise ValueError(
                "expected a version string, not a number: YAML reads an unquoted version as a "
                'number (0.10 as 0.1); quote it as written, e.g. vllm_version: "0.23.0"'
            )
        return value

    @model_validator(mode="after")
    def _pair(self) -> "LatencySpec":
        if (self.alpha_coeffs is None) != (self.beta_coeffs is None):
            raise ValueError("alpha_coeffs and beta_coeffs must be given together")
        if self.alpha_coeffs is not None and "model" not in self.model_fields_set:
            self.model = "blackbox"  # BLIS: alpha/beta coefficients imply blackbox
        return self


SloClassName = Literal[tuple(SLO_CLASS_PRIORITY)]  # the classes the engine prioritises
SloPriority = integer(
    -SLO_PRIORITY_BOUND,
    SLO_PRIORITY_BOUND,
    "",
    f"BLIS accepts class priorities from -{SLO_PRIORITY_BOUND} to {SLO_PRIORITY_BOUND}",
)


class EngineSpec(_Strict):
    """One vLLM instance's knobs (BLIS flag names, with units where they have one)."""

    total_kv_blocks: PositiveBlocks | None = Field(None, description="None = defaults.yaml or auto")
    block_size_tokens: BlockSize = 16
    gpu_memory_utilization: _MemoryFraction = 0.9
    # None = auto: a stock vLLM server's limits on the GPU under servesim's physics model
    # (8,192 tokens and 1,024 sequences on an H100), BLIS's 2,048 and 256 under BLIS's
    # backends (`deployment.batch_limits`).
    max_num_running_reqs: PositiveRequests | None = Field(
        None, description="None = auto: vLLM's default on the GPU with physics, else 256"
    )
    max_num_scheduled_tokens: PositiveTokens | None = Field(
        None, description="None = auto: vLLM's default on the GPU with physics, else 2048"
    )
    long_prefill_token_threshold: Tokens = 0
    max_model_len: Tokens | None = Field(None, description="None = auto (roofline); 0 = off")
    scheduler: str = "fcfs"
    priority_policy: str = "constant"
    preemption_policy: str = Field("fcfs", description="fcfs (newest admitted) | priority")
    # BLIS-current's `admission.slo_priorities`: class priorities (higher = more important)
    # replacing its defaults (critical 4, standard 3, batch -1, sheddable -2, background -3).
    slo_priorities: dict[SloClassName, SloPriority] | None = Field(
        None, description="per SLO class, -100..100; for priority preemption and slo-class"
    )
    batch_formation: str = Field(
        "chunked", description="chunked (vLLM V1) | whole-prompt (Orca) | prefill-first (vLLM V0)"
    )
    enable_prefix_caching: Flag = True
    kv_cpu_blocks: Blocks = Field(0, description="CPU KV tier size in blocks; 0 = off")
    kv_offload_policy: Literal["evict", "mirror"] = "evict"
    kv_transfer_bandwidth_gb_per_s: Bandwidth = Field(50.0, description="host link, per GPU")
    kv_transfer_base_latency_us: TimeUs = 0
    kv_reload_blocking: Flag = False
    # vLLM's --kv-cache-dtype: auto = the model's dtype; fp8 halves the bytes per token.
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    # How free GPU memory becomes blocks (docs/models-and-hardware.md): BLIS's formula, or
    # vLLM's per-GPU allocation (tp x fewer blocks than BLIS's for tp > 1). auto: vllm with
    # servesim's physics model, blis with BLIS's backends (their runs reproduce).
    kv_capacity_rule: Literal["auto", "blis", "vllm"] = "auto"


class AdmissionSpec(_Strict):
    policy: str = "always-admit"
    token_bucket_capacity: TokenBucketTokens | None = Field(None, description="tokens")
    token_bucket_refill_rate: TokenRate | None = Field(None, description="tokens per second")
    latency_us: TimeUs = 0


class _ProfileResolved(_Strict):
    """A spec whose `_RESOLVED` fields a routing profile fills in or reinterprets: attributes
    hold the resolved values (what the simulation reads), dumps hold the values as given, so a
    spec dumped, overridden (e.g. a new profile) and validated again resolves afresh."""

    _RESOLVED: ClassVar[tuple[str, ...]] = ()
    _given: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._RESOLVED:
            self._given = {**self._given, name: value}
        super().__setattr__(name, value)

    def given(self, name: str) -> Any:
        """The value of a resolved field as given (None: left to the profile)."""
        return self._given.get(name, self.__dict__[name])

    def _set_resolved(self, values: dict[str, Any]) -> None:
        self._given = {f: self.given(f) for f in self._RESOLVED}
        self.__dict__.update(values)

    @model_serializer(mode="wrap")
    def _dump_as_given(self, handler: Any, info: SerializationInfo) -> Any:
        data = handler(self)
        for name in self._RESOLVED:
            if name in data:
                value = self.given(name)
                if value is None and info.exclude_none:
                    del data[name]
                else:
                    data[name] = value
        return data


class RoutingSpec(_ProfileResolved):
    """Routing; `profile` says which BLIS release's routing to follow (docs/cluster.md
    "Routing profiles"): the default scorer list, the meaning of scorer names BLIS changed,
    and the signal ages left unset."""

    _RESOLVED = ("scorers", "snapshot_refresh_interval_us", "cache_signal_delay_us")
    policy: str = "round-robin"
    profile: str = Field("blis-mar", description="blis-mar (default) | blis-current")
    scorers: str | None = Field(None, description='"name:weight,..." for weighted routing')
    latency_us: TimeUs = 0
    snapshot_refresh_interval_us: TimeUs | None = Field(
        None, description="age of load signals; unset: the profile's (blis-mar 0 = always fresh)"
    )
    cache_signal_delay_us: TimeUs | None = Field(
        None, description="age of the prefix-cache view; unset: the profile's (blis-mar 0 = live)"
    )

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str) -> str:
        from .cluster.routing import routing_profile

        return routing_profile(value).name

    @model_validator(mode="after")
    def _apply_profile(self) -> "RoutingSpec":
        from .cluster.routing import resolve_routing

        self._set_resolved(
            resolve_routing(
                self.profile,
                scorers=self.given("scorers"),
                snapshot_refresh_interval_us=self.given("snapshot_refresh_interval_us"),
                cache_signal_delay_us=self.given("cache_signal_delay_us"),
            )
        )
        return self


class DecisionTraceSpec(_Strict):
    level: Literal["none", "decisions"] = "none"
    # Alternatives recorded per decision: there are never more than instances.
    counterfactual_k: Instances = 0
    summarize: Flag = False
    path: Path | None = Field(None, description="write decisions as JSON Lines")

    @model_validator(mode="after")
    def _what_needs_decisions_records_them(self) -> "DecisionTraceSpec":
        # A decision file with nothing recorded was written empty, without a word, and a
        # summary (or counterfactuals) of nothing printed zeros beside a run that routed every
        # request (BLIS-Mar warns and prints none): each implies the decisions it is about,
        # as --decisions-path does.
        wanted = [
            name
            for name, given in (
                ("a path", self.path is not None),
                ("summarize", self.summarize),
                ("counterfactual_k", self.counterfactual_k > 0),
            )
            if given
        ]
        if wanted and self.level == "none":
            if "level" in self.model_fields_set:
                raise ValueError(
                    f"level: invalid value 'none' with {wanted[0]}; it needs level decisions "
                    "(or leave level unset)"
                )
            self.level = "decisions"
        return self


class PoolSpec(_ProfileResolved):
    """Per-pool overrides of the deployment (docs/behaviour.md §7.4): unset fields inherit the
    scenario's. The cluster's routing profile reinterprets `routing_scorers`."""

    _RESOLVED = ("routing_scorers",)
    hardware: str | None = None
    tp: Gpus | None = None
    pp: Gpus | None = None
    ep: Gpus | None = None
    dp: Gpus | None = None
    latency_model: str | None = None
    max_model_len: Tokens | None = None
    total_kv_blocks: PositiveBlocks | None = None
    routing_scorers: str | None = Field(None, description="weighted routing within the pool")

    @property
    def changes_deployment(self) -> bool:
        return any(
            v is not None
            for v in (self.hardware, self.tp, self.pp, self.ep, self.dp, self.latency_model,
                      self.max_model_len, self.total_kv_blocks)
        )  # fmt: skip


class PDSpec(_Strict):
    """Prefill/decode disaggregation (docs/behaviour.md §7): pools, decider, KV transfer link."""

    prefill_instances: Instances = 0
    decode_instances: Instances = 0
    decider: str = "never"
    prefix_threshold: Tokens | None = Field(None, description="non-cached tokens; 16")
    prefix_mode: Literal["global", "decode-cache"] = "global"
    prompt_length_threshold: Tokens | None = Field(None, description="tokens; 256")
    transfer_bandwidth_gb_per_s: Bandwidth = 25.0
    transfer_base_latency_ms: Milliseconds = 0.05
    kv_bytes_per_token: BytesPerToken | None = Field(None, description="None = model geometry")
    transfer_contention: Flag = True
    transfer_slots: TransferSlots | None = Field(
        None, description="in flight at most; None = no limit"
    )
    prefill: PoolSpec = Field(default_factory=dict, validate_default=True)
    decode: PoolSpec = Field(default_factory=dict, validate_default=True)

    @property
    def enabled(self) -> bool:
        return self.prefill_instances > 0 or self.decode_instances > 0


class ClusterSpec(_Strict):
    """Many instances behind one router (docs/behaviour.md §6), optionally split into PD pools
    (§7)."""

    num_instances: PositiveInstances = 1
    admission: AdmissionSpec = Field(default_factory=dict, validate_default=True)
    routing: RoutingSpec = Field(default_factory=dict, validate_default=True)
    trace: DecisionTraceSpec = Field(default_factory=dict, validate_default=True)
    fitness_weights: str | None = None
    pd: PDSpec = Field(default_factory=dict, validate_default=True)

    @model_validator(mode="after")
    def _pools(self) -> "ClusterSpec":
        from .cluster.routing import resolve_scorers

        pd = self.pd
        for role, pool in (("prefill", pd.prefill), ("decode", pd.decode)):
            given = pool.given("routing_scorers")
            if given is not None:
                field = f"pd.{role}.routing_scorers (--{role}-routing-scorers)"
                resolved = resolve_scorers(given, self.routing.profile, field=field)
                pool._set_resolved({"routing_scorers": resolved})  # noqa: SLF001
        if pd.enabled:
            if pd.prefill_instances == 0 or pd.decode_instances == 0:
                raise ValueError(
                    f"pd: prefill_instances ({pd.prefill_instances}) and decode_instances "
                    f"({pd.decode_instances}) must both be > 0 when either is"
                )
            if pd.prefill_instances + pd.decode_instances > self.num_instances:
                raise ValueError(
                    f"pd: prefill_instances + decode_instances = "
                    f"{pd.prefill_instances + pd.decode_instances} exceeds num_instances "
                    f"({self.num_instances})"
                )
        return self


class SloTargetsSpec(_Strict):
    """Latency targets of a request, ms (None = no target on that metric)."""

    ttft_ms: SloTargetMs | None = None
    itl_ms: SloTargetMs | None = None
    e2e_ms: SloTargetMs | None = None


class SloSpec(SloTargetsSpec):
    """The run's SLOs: targets for every request, overridden per SLO class (`slo_class` of
    the workload's clients or the trace's rows); see docs/results.md."""

    classes: dict[str, SloTargetsSpec] = Field(default_factory=dict)


class Scenario(_Strict):
    """A whole run: the deployment, the engine, the traffic, the seed and the horizon."""

    # Folder that relative paths inside the scenario (and its workload) resolve from.
    _base_dir: Path | None = PrivateAttr(default=None)

    name: str = ""
    description: str = ""
    seed: Seed = 42
    horizon_us: PositiveTimeUs | None = None
    model: str = "meta-llama/llama-3.1-8b-instruct"
    # BLIS --model-config-folder: the model's config.json comes from here; `model` names it.
    model_config_folder: Path | None = None
    hardware: str | None = None
    tp: Gpus | None = None
    # Pipeline stages and expert parallelism (docs/parallelism.md); ep 1 = experts sliced by
    # TP; enable_expert_parallel = vLLM's flag, ep = tp x dp.
    pp: Gpus | None = None
    ep: Gpus | None = None
    enable_expert_parallel: Flag = False
    # Data-parallel attention ranks per instance (BLIS's and vLLM's --dp): each rank its own
    # scheduler and KV cache, all stepping together (engine/dp_group.py).
    dp: Gpus | None = None
    # vLLM's --quantization, simplified: auto = the config's checkpoint format.
    weight_dtype: Literal["auto", "bf16", "fp16", "fp8", "int4", "fp4"] = "auto"
    hardware_file: Path | None = None
    latency: LatencySpec = Field(default_factory=dict, validate_default=True)
    engine: EngineSpec = Field(default_factory=dict, validate_default=True)
    # Speculative decoding (docs/speculative.md); None = off.
    speculative: SpeculativeSpec | None = None
    # Multi-LoRA serving (docs/lora.md); None = off: requests' adapters run on the base model.
    lora: LoRASpec | None = None
    cluster: ClusterSpec = Field(default_factory=dict, validate_default=True)
    workload: WorkloadField | None = None
    workload_spec: Path | None = None
    trace: TraceSpec | None = None
    # The fleet (docs/behaviour.md §8, §A6, §A7); see docs/infrastructure.md.
    deployments: list[DeploymentSpec] = Field(default_factory=empty_list)
    node_pools: list[NodePoolSpec] = Field(default_factory=empty_list)
    instance_lifecycle: LifecycleSpec = Field(default_factory=dict, validate_default=True)
    events: list[EventSpec] = Field(default_factory=empty_list)
    autoscaler: list[AutoscalerSpec] = Field(default_factory=empty_list)
    # Latency targets that SLO attainment and goodput are judged against.
    slo: SloSpec = Field(default_factory=dict, validate_default=True)
    # Check the simulator's laws during the run and stop at the first broken one
    # (simulator/invariants.py). Results are identical either way; only slower.
    check_invariants: Flag = False

    @field_validator("model")
    @classmethod
    def _model_nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a model")
        return v

    @field_validator("hardware")
    @classmethod
    def _hardware_nonempty(cls, v: str | None) -> str | None:
        # Empty text ran on the default GPU silently; null (the field left out) is the default.
        if v is not None and not v.strip():
            raise ValueError("must name a GPU (servesim hardware lists them), or be left out")
        return v

    @model_validator(mode="after")
    def _source(self) -> "Scenario":
        given = [
            name
            for name in ("workload", "workload_spec", "trace")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give one traffic source, not {' and '.join(given)}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _pd_pools_from_one_place(cls, data: Any) -> Any:
        """Deployments with PD roles size the pools themselves; pool sizes in cluster.pd as
        well would be checked against cluster.num_instances (1 with deployments) and refused
        with a message about a count the user never set. Said here, before that check."""
        if not isinstance(data, dict):
            return data
        deployments = data.get("deployments")
        cluster = data.get("cluster")
        pd = cluster.get("pd") if isinstance(cluster, dict) else None
        roles = isinstance(deployments, list) and any(
            isinstance(d, dict) and d.get("role") in ("prefill", "decode") for d in deployments
        )
        sizes = isinstance(pd, dict) and any(
            pd.get(k) for k in ("prefill_instances", "decode_instances")
        )
        if roles and sizes:
            raise ValueError(
                "cluster.pd.prefill_instances/decode_instances: deployments with role prefill "
                "and decode size the PD pools (each its num_instances); remove the pool sizes "
                "from cluster.pd (keep its decider and link settings)"
            )
        return data

    @model_validator(mode="after")
    def _fleet(self) -> "Scenario":
        """Names the fleet refers to must exist; checks that need the resolved fleet (GPU
        types, instance and node ids) run when the deployment is resolved."""
        pools = [p.name for p in self.node_pools]
        _unique("node_pools", pools)
        names = [d.name for d in self.deployments]
        _unique("deployments", names)
        no_pools = "none (no node_pools)"
        no_deployments = "none (no deployments)"
        for i, d in enumerate(self.deployments):
            _known(f"deployments[{i}].pool", "node pool", d.pool, pools, no_pools)
        for i, e in enumerate(self.events):
            _known(f"events[{i}].pool", "node pool", e.pool, pools, no_pools)
            _known(f"events[{i}].deployment", "deployment", e.deployment, names, no_deployments)
        for i, a in enumerate(self.autoscaler):
            _known(f"autoscaler[{i}].deployment", "deployment", a.deployment, names, no_deployments)
        _autoscaled_counts_within_bounds(self)
        pd = self.cluster.pd
        pd_roles = any(d.role != "unified" for d in self.deployments)
        if pd.decider != "never" and not pd.enabled and not pd_roles:
            raise ValueError(
                f"cluster.pd.decider {pd.decider!r} needs both pools: set prefill_instances "
                "and decode_instances (or deployments with role prefill and decode)"
            )
        if self.deployments and self.cluster.num_instances != 1:
            raise ValueError(
                f"cluster.num_instances: {self.cluster.num_instances}, but with `deployments` "
                "each deployment sets its own num_instances; remove cluster.num_instances"
            )
        return self

    @model_validator(mode="after")
    def _fleet_size(self) -> "Scenario":
        """Each count is bounded on its own; so is the whole fleet, which several deployments,
        autoscaler headroom and add_instance events could otherwise multiply."""
        slots = _instance_slots(self)
        if slots > MAX_INSTANCES:
            parts = "deployments' num_instances" if self.deployments else "cluster.num_instances"
            raise ValueError(
                f"the fleet has up to {slots:,} instances ({parts}, autoscaler max_instances "
                f"and add_instance events together); at most {MAX_INSTANCES:,}: an instance "
                "takes about 13 KB of memory before its first request"
            )
        nodes = sum(p.max_nodes for p in self.node_pools)
        if nodes > MAX_NODES:
            raise ValueError(
                f"node_pools: max_nodes add up to {nodes:,}; at most {MAX_NODES:,} in all: a "
                "fleet never needs more nodes than instances"
            )
        return self


def _instance_slots(scenario: Scenario) -> int:
    """Instances the fleet can ever hold: the initial ones, each autoscaler's headroom above
    its deployment's initial count and one per add_instance event. Mirrors the slots that
    fleet_plan.plan_fleet builds (deployments in role order; an autoscaler without a deployment
    scales the first)."""
    initial, first = _initial_counts(scenario)
    slots = sum(initial.values())
    for a in scenario.autoscaler:
        slots += max(0, a.max_instances - initial.get(a.deployment or first, 0))
    return slots + sum(e.action == "add_instance" for e in scenario.events)


def _initial_counts(scenario: Scenario) -> tuple[dict[str, int], str]:
    """Each deployment's initial instance count (deployments in role order; "" for the
    scenario's own instances without deployments), and the deployment an autoscaler without
    one scales (the first)."""
    order = {"prefill": 0, "decode": 1, "unified": 2}
    specs = sorted(scenario.deployments, key=lambda d: order[d.role])
    initial = {d.name: d.num_instances for d in specs} or {"": scenario.cluster.num_instances}
    return initial, next(iter(initial))


def _autoscaled_counts_within_bounds(scenario: Scenario) -> None:
    """An autoscaled deployment starts at most at its max_instances: the live count never
    exceeds the bound (docs/infrastructure.md), and the autoscaler only ever adds instances
    up to it, so a start above it would run over the bound all along."""
    initial, first = _initial_counts(scenario)
    scaled: dict[str, int] = {}
    for i, a in enumerate(scenario.autoscaler):
        name = a.deployment or first
        if name in scaled:
            # Two would fight over the count (each its own bounds) and report one set of
            # metrics under the same keys.
            where = f"deployment {name!r}" if name else "the cluster's instances"
            raise ValueError(
                f"autoscaler[{i}]: {where} is already scaled by autoscaler[{scaled[name]}]; "
                "give each deployment one autoscaler"
            )
        scaled[name] = i
        if initial.get(name, 0) > a.max_instances:
            where = f"deployment {name!r}" if name else "cluster.num_instances"
            raise ValueError(
                f"autoscaler[{i}].max_instances: {a.max_instances}, below the "
                f"{initial[name]} instances {where} starts with; raise max_instances or "
                "start with fewer"
            )


def _known(field: str, kind: str, value: str | None, known: list[str], none: str) -> None:
    """A reference to a pool or deployment must name one the scenario defines."""
    if value is not None and value not in known:
        raise ValueError(f"{field}: unknown {kind} {value!r}; known: {', '.join(known) or none}")


def _unique(field: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{field}: name {name!r} is used twice; names must be unique")
        seen.add(name)


def scenario_from_dict(data: dict[str, Any], source: str = "scenario") -> "Scenario":
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_spec_error(exc, source, Scenario)) from None


def load_scenario(path: str | Path) -> "Scenario":
    """Read and validate a scenario YAML file. Relative paths inside resolve from its folder."""
    require_path("load_scenario", path)
    p = Path(path)
    data = read_yaml_mapping(p, "scenario", empty_ok=True)
    if not data:
        # An empty file is far more likely a mistake (a wrong path, a truncated copy) than a
        # request for every default; the defaults are one `servesim run` without a file away.
        raise ConfigError(
            f"scenario: {str(p)!r} is empty; give at least one field (e.g. `model:`), or run "
            "without a scenario file to use every default"
        )
    scenario = scenario_from_dict(data, source=str(p))
    base = p.parent
    if scenario.trace is not None:
        header = scenario.trace.header
        scenario.trace = scenario.trace.model_copy(
            update={
                "header": _resolve(base, header) if header is not None else None,
                "data": _resolve(base, scenario.trace.data),
            }
        )
    if scenario.hardware_file is not None:
        scenario.hardware_file = _resolve(base, scenario.hardware_file)
    if scenario.model_config_folder is not None:
        scenario.model_config_folder = _resolve(base, scenario.model_config_folder)
    elif "model" in scenario.model_fields_set and (model := _model_path(base, scenario.model)):
        # With model_config_folder, `model` is only the model's name.
        scenario.model = model
    for deployment in scenario.deployments:
        if deployment.model is not None and (model := _model_path(base, deployment.model)):
            deployment.model = model
    spec = scenario.speculative
    if spec is not None and spec.draft_model and (model := _model_path(base, spec.draft_model)):
        spec.draft_model = model
    if scenario.latency.coeffs_file is not None:
        scenario.latency.coeffs_file = _resolve(base, scenario.latency.coeffs_file)
    if scenario.workload_spec is not None:
        scenario.workload_spec = _resolve(base, scenario.workload_spec)
    scenario._base_dir = base
    return scenario


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else base / p


def _model_path(base: Path, model: str) -> str | None:
    """`model` resolved from the scenario's folder when it names a relative path (as
    `catalog.models.load_model` would take it: `./` or `../`, a .json file, or something
    that exists there), else None: a registry name such as meta-llama/llama-3.1-8b-instruct
    stays a name, and an absolute or `~` path needs no folder."""
    text = model.strip()
    if not text or text.startswith(("/", "~")) or "\x00" in text:
        return None
    candidate = base / text
    try:
        exists = candidate.exists()
    except (OSError, ValueError):  # a name too long to be a path is no path
        exists = False
    if text.startswith(".") or text.endswith(".json") or exists:
        return str(candidate)
    return None


def explicitly_set(scenario: Scenario, dotted: str) -> bool:
    """Whether the scenario's author set the field at `dotted` (e.g. "engine.total_kv_blocks")
    rather than leaving it to its default (an override counts as set)."""
    node: Any = scenario
    for key in dotted.split("."):
        if not isinstance(node, BaseModel) or key not in node.model_fields_set:
            return False
        node = getattr(node, key)
    return True


def _field_at(tree: dict[str, Any], keys: list[str]) -> Any:
    """The value at `keys` in a dumped scenario (None where the path leaves the mappings)."""
    node: Any = tree
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def not_a_section(where: str, inside: str, value: Any) -> ConfigError:
    """The error for a dotted path that reaches inside a field holding a list or a value."""
    return ConfigError(
        f"{where}: {inside} is not a section (it is {excerpt(value)}); a dotted override "
        f"cannot reach inside it (set {inside} whole)"
    )


def authored_fields(model: BaseModel) -> dict[str, Any]:
    """The fields the model's author set, as `model_dump(exclude_unset=True)` gives them, and
    also those set by assignment inside a section left to its default (`sc.cluster.num_instances
    = 3` marks the field set on `cluster` but not `cluster` on the scenario, so the plain dump
    dropped it: a sweep point then ran one instance where `simulate(sc)` ran three)."""
    data: dict[str, Any] = {}
    given = model.model_fields_set
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            section = authored_fields(value)
            if section or name in given:
                data[name] = section
        elif name in given:
            data[name] = model.model_dump(mode="python", include={name}, exclude_unset=True)[name]
    return data


# The `source` the command line's overrides carry (api.with_overrides).
FLAGS_SOURCE = "command-line flags"


def apply_overrides(
    scenario: Scenario, overrides: dict[str, Any], source: str = "overrides"
) -> "Scenario":
    """Return a copy with dotted-path overrides applied (e.g. {"engine.scheduler": "sjf"}).
    Only what the scenario's author set is carried over (and the overrides), so the copy's
    defaults are still defaults: a rule that reads "left unset" (blackbox when alpha/beta
    coefficients come without a model, a node pool's memory from its GPU) reads the copy as
    it read the original."""
    data = authored_fields(scenario)
    full: dict[str, Any] | None = None  # every field, defaults included: what a path crosses
    for dotted, value in overrides.items():
        node = data
        keys = dotted.split(".")
        for depth, key in enumerate(keys[:-1]):
            if node.get(key) is None:
                # Left unset: a section starts empty, any other field is what it defaults to
                # (a path must not reach inside a list or a value).
                full = full if full is not None else scenario.model_dump(mode="python")
                default = _field_at(full, keys[: depth + 1])
                node[key] = {} if default is None or isinstance(default, dict) else default
            node = node[key]
            if not isinstance(node, dict):
                raise not_a_section(f"{source}: {dotted}", ".".join(keys[: depth + 1]), node)
        node[keys[-1]] = value
    if source == FLAGS_SOURCE:
        _check_think_time_flag(data, overrides)
    updated = scenario_from_dict(data, source=source)
    updated._base_dir = scenario._base_dir  # noqa: SLF001
    return updated


def _check_think_time_flag(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """`--think-time-ms` (which sets workload.think_time_us) without closed-loop users, named
    as the flag was given and with the flag to add; a scenario file's `think_time_us` without
    `concurrency` is refused by `SyntheticWorkload`, which names the fields."""
    think_us = overrides.get("workload.think_time_us")
    workload = data.get("workload")
    if not isinstance(think_us, int | float) or isinstance(think_us, bool) or think_us <= 0:
        return  # none, 0 (no pause: allowed), or a bad value the field's check reports
    if not isinstance(workload, dict) or V2_ONLY_KEYS & set(workload):
        return
    if workload.get("concurrency"):
        return
    raise ConfigError(
        f"--think-time-ms {think_us / 1000:g}: a think time applies to closed-loop users "
        "(the pause after each response); add --concurrency N (the number of users), or "
        "leave --think-time-ms out for open-loop traffic"
    )
