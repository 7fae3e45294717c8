"""KV-cache capacity from a model's own config.json, computed the way vLLM computes it.

Public API (the `plan` command and the verify role use it; keep it stable):

    KvShape.from_model_config(config: dict) -> KvShape
    plan_capacity(model_config, *, tensor_parallel_size, kv_cache_dtype, max_model_len, kv_bytes_per_gpu,
                  block_size=None, max_num_batched_tokens=None, avg_input_len=None, vllm_version=None,
                  num_speculative_tokens=0, mamba_cache_mode=None, enable_prefix_caching=None, device="GPU",
                  dtype=None, pipeline_parallel_size=1, decode_context_parallel_size=1,
                  pp_layer_partition=None, env=None, kv_transfer=False,
                  disable_hybrid_kv_cache_manager=None)
        -> CapacityPlan          # the one capacity function: every path calls it (issue 34)
    default_mamba_cache_mode(enable_prefix_caching, vllm_version, architectures) -> str
    CapacityPlan.to_dict()   # the JSON of `vllm-fleet plan --json` (DESIGN §4)

How vLLM counts (vllm-facts §4; checked against real logs in tests/unit/test_capacity*.py):
- Each attention layer stores, per token and per GPU, `kv_heads_per_rank * (head_dim + v_head_dim) * bytes`
  with `kv_heads_per_rank = max(1, kv_heads // TP)`; MLA layers store `kv_lora_rank + qk_rope_head_dim`
  elements once, on every rank. fp8 KV dtypes are 1 byte; `auto` is the model dtype.
- Layers of one kind form KV-cache groups (one group when the model has one kind; otherwise groups of
  `min(layers per kind)` layers). A block of the shared pool costs `group_size * page_bytes`; the pool holds
  `kv_bytes_per_gpu // bytes_per_block` blocks (the reserved null block included).
- Linear-attention layers (Gated DeltaNet in Qwen3-Next / Qwen3.5) keep a fixed recurrent state per request.
  The attention block size is raised to the smallest multiple of 16 whose page holds that state, and each
  request takes `1 + spec` (`mamba_cache_mode="none"`) or `2 + spec` (`"align"`, prefix caching on) blocks per
  linear group (`"all"`: one per block of the request, blocks rounded to the Mamba chunk size).
  Which mode vLLM picks (`default_mamba_cache_mode`): a hybrid model gets prefix caching only when asked
  before vLLM 0.28.0 (then "all" for the Mamba-2 families that support it, else "align"), by default from
  0.28.0 (always "align"); without prefix caching the mode is "none".
- vLLM >= 0.20.1 reports `tokens = int(num_blocks / blocks_per_request * max_model_len)` (group-aware); older
  releases report `num_blocks // num_groups * block_size`. Concurrency is `num_blocks / blocks_per_request`.
- What the KV-cache manager of the release decides before that (default block size per device, the hybrid
  manager on or off, prefix caching a model does not support) is `plan.kv_manager`'s; whether real logs of
  the release prove the result is `plan.proven`'s, and the plan says `exact: false` where they do not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan import kv_manager, proven
from vllm_fleet.plan.kv_manager import default_mamba_cache_mode
from vllm_fleet.plan.model import NON_ATTENTION_KINDS, ModelInfo, check_heads
from vllm_fleet.plan.model import _int as _int
from vllm_fleet.plan.state import MODEL_DTYPE_BYTES as _MODEL_DTYPE_BYTES
from vllm_fleet.plan.state import LinearAttentionState, MambaState, linear_state
from vllm_fleet.sizes import format_bytes, format_count

# Every value vLLM 0.33 accepts (vllm-facts §1); only some can be sized here.
VALID_KV_CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
_KV_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
# vLLM's fp8_ds_mla page per token and layer: 512 fp8 latent values, 4 float32 scales, 64 bf16 rope values.
_FP8_DS_MLA_BYTES_PER_TOKEN = 656
_DEFAULT_ASSUMED_BATCHED_TOKENS = 8192
# The attention kernels' block alignment that vLLM uses when it enlarges blocks for hybrid models.
_HYBRID_BLOCK_ALIGNMENT = 16
_MAMBA_CACHE_MODES = ("none", "align", "all")
# First release seen printing the group-aware token count (the v0.20.1 log of club-3090#91 matches it).


@dataclass(frozen=True)
class KvShape:
    """What a model stores per token, read from its config.json."""

    model_type: str
    num_layers: int
    full_attention_layers: int
    sliding_window_layers: int
    linear_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    sliding_window: int | None
    mla_kv_lora_rank: int | None
    mla_rope_head_dim: int | None
    model_dtype: str
    max_position_limit: int | None
    linear: LinearAttentionState | MambaState | None
    notes: tuple[str, ...] = ()
    layer_kinds: tuple[str, ...] = ()
    attention_sinks: bool = False
    architectures: tuple[str, ...] = ()
    mamba_chunk_size: int | None = None  # Mamba-2 SSD chunk ("all" mode rounds the block size to it)
    chunked_local_layers: int = 0  # Llama 4's chunked-local attention layers
    attention_chunk_size: int | None = None

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank is not None

    @property
    def attention_layers(self) -> int:
        return self.full_attention_layers + self.sliding_window_layers + self.chunked_local_layers

    @property
    def mixes_attention_kinds(self) -> bool:
        """Full attention beside sliding-window or chunked-local layers: what `unify_hybrid_kv_cache_specs`
        turns into full attention when the hybrid KV-cache manager is off."""
        return bool(self.full_attention_layers and (self.sliding_window_layers or self.chunked_local_layers))

    def as_full_attention(self) -> KvShape:
        """The shape vLLM sizes with the hybrid KV-cache manager off (`unify_hybrid_kv_cache_specs`,
        vllm/v1/core/kv_cache_utils.py): beside full attention, every sliding-window and chunked-local layer
        keeps the whole request."""
        if not self.mixes_attention_kinds:
            return self
        kinds = tuple("full" if kind in ("sliding", "chunked") else kind for kind in self.layer_kinds)
        return replace(
            self,
            full_attention_layers=self.attention_layers,
            sliding_window_layers=0,
            chunked_local_layers=0,
            layer_kinds=kinds,
        )

    def kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        if self.is_mla:
            return 1
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def bytes_per_token_per_layer(self, kv_heads: int, kv_dtype: str, dtype_bytes: int) -> int:
        if self.is_mla:
            if kv_dtype == "fp8_ds_mla":
                return _FP8_DS_MLA_BYTES_PER_TOKEN
            return (int(self.mla_kv_lora_rank or 0) + int(self.mla_rope_head_dim or 0)) * dtype_bytes
        return kv_heads * (self.head_dim + self.v_head_dim) * dtype_bytes

    @classmethod
    def from_model_config(cls, config: dict[str, Any], source: str = "model config") -> KvShape:
        return _shape_from_config(config, source)


def _shape_from_config(config: dict[str, Any], source: str) -> KvShape:
    info = ModelInfo.from_config(config, source)
    cfg = info.raw
    kinds = info.layer_kinds
    linear = linear_state(info, source)
    return KvShape(
        model_type=info.model_type,
        num_layers=info.num_layers,
        full_attention_layers=info.count("full"),
        sliding_window_layers=info.count("sliding"),
        linear_attention_layers=sum(info.count(k) for k in NON_ATTENTION_KINDS),
        num_attention_heads=info.num_attention_heads,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        v_head_dim=info.v_head_dim,
        sliding_window=info.sliding_window,
        mla_kv_lora_rank=info.mla_kv_lora_rank,
        mla_rope_head_dim=info.mla_rope_head_dim,
        model_dtype=info.torch_dtype,
        max_position_limit=info.position_limit,
        linear=linear,
        notes=info.notes,
        layer_kinds=kinds,
        attention_sinks=info.attention_sinks,
        architectures=info.architectures,
        mamba_chunk_size=(
            _int(cfg, ("mamba_chunk_size", "chunk_size"), source, default=0) or None
            if isinstance(linear, MambaState)
            else None
        ),
        chunked_local_layers=info.count("chunked"),
        attention_chunk_size=info.attention_chunk_size,
    )


def _kv_dtype_bytes(kv_cache_dtype: str, shape: KvShape, model_dtype: str) -> int:
    if kv_cache_dtype not in VALID_KV_CACHE_DTYPES:
        raise FleetInputError(
            f"--kv-cache-dtype: {kv_cache_dtype!r} is not a vLLM kv-cache dtype; valid values are "
            f"{', '.join(VALID_KV_CACHE_DTYPES)}"
        )
    if kv_cache_dtype == "auto":
        return _MODEL_DTYPE_BYTES[model_dtype]
    if kv_cache_dtype == "fp8_ds_mla":
        if not shape.is_mla:
            raise FleetInputError(
                "--kv-cache-dtype: fp8_ds_mla is only for MLA models (DeepSeek-style); this model has no "
                "kv_lora_rank. Use fp8 (or fp8_e4m3) instead"
            )
        return 1
    if kv_cache_dtype not in _KV_DTYPE_BYTES:
        raise FleetInputError(
            f"--kv-cache-dtype: the planner cannot size {kv_cache_dtype!r} (its page layout is not "
            f"modelled); "
            "plan with fp8 / bfloat16 / auto, or check the real log with `vllm-fleet logcheck`"
        )
    return _KV_DTYPE_BYTES[kv_cache_dtype]


@dataclass(frozen=True)
class _Group:
    kind: str  # full | sliding | linear
    count: int  # how many groups of this kind


@dataclass
class CapacityPlan:
    """The answer of `vllm-fleet plan` (DESIGN §4); `to_dict()` is its JSON."""

    model_type: str
    device: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    exact: bool  # False: a family or a parallel layout whose counting is not checked against vLLM
    approximate_because: list[str]
    kv_cache_dtype: str
    kv_dtype_bytes: int
    max_model_len: int
    kv_bytes_per_gpu: int
    block_size: int
    num_gpu_blocks: int
    kv_heads_per_gpu: int
    attention_layers: int
    full_attention_layers: int
    sliding_window_layers: int
    linear_attention_layers: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_token_full_attention: int
    linear_state_bytes_per_request_per_gpu: int
    blocks_per_request: int
    gpu_kv_tokens: int
    max_concurrency: float
    fits_on_gpu: bool
    estimated_max_model_len: int
    offload_bytes_needed: int
    # KV memory per GPU one request of max_model_len needs: vLLM's "X GiB KV cache is needed"
    kv_bytes_needed_per_request: int
    prefill_chunks: int | None
    max_num_batched_tokens: int | None
    avg_input_len: int | None
    concurrency_at_avg_input_len: float | None
    token_formula: str
    kv_cache_line: str
    expectations: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    chunked_local_layers: int = 0  # as vLLM sizes them: 0 when the hybrid manager is off (full attention)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["max_concurrency"] = round(self.max_concurrency, 4)
        if self.concurrency_at_avg_input_len is not None:
            data["concurrency_at_avg_input_len"] = round(self.concurrency_at_avg_input_len, 4)
        return data


def _groups(shape: KvShape) -> tuple[int, list[_Group]]:
    """vLLM's KV-cache groups: (layers per group, groups per kind)."""
    counts = {
        kind: number
        for kind, number in (
            ("full", shape.full_attention_layers),
            ("sliding", shape.sliding_window_layers),
            ("chunked", shape.chunked_local_layers),
            ("linear", shape.linear_attention_layers),
        )
        if number > 0
    }
    if len(counts) == 1:
        kind, number = next(iter(counts.items()))
        return number, [_Group(kind, 1)]
    smallest, largest = min(counts.values()), max(counts.values())
    # vLLM takes the largest kind as group size when that wastes < 25% (padding layers), else the smallest.
    group_size = largest if largest < smallest * 1.25 else smallest
    return group_size, [_Group(kind, math.ceil(number / group_size)) for kind, number in counts.items()]


def _blocks_for(
    group: _Group, tokens: int, block_size: int, shape: KvShape, batched: int, state_blocks: int
) -> int:
    if group.kind == "full":
        return math.ceil(tokens / block_size)
    if group.kind == "sliding":
        window = shape.sliding_window or tokens
        return math.ceil(min(window - 1 + batched, tokens) / block_size) + 1
    if group.kind == "chunked":
        # ChunkedLocalAttentionSpec.max_memory_usage_bytes (vllm/v1/kv_cache_interface.py, 0.12.0): at most
        # one chunk of computed tokens plus the newly scheduled ones, no spare block
        chunk = shape.attention_chunk_size or tokens
        return math.ceil(min(chunk + batched, tokens) / block_size)
    return state_blocks


def pp_stage_layers(num_layers: int, pp_size: int, partition: list[int] | None = None) -> list[int]:
    """Layers per pipeline stage: `vllm/distributed/utils.py get_pp_indices` (the remainder goes to the
    stages before the last, from the second-to-last backwards), or VLLM_PP_LAYER_PARTITION."""
    if partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers or min(partition) <= 0:
            raise FleetInputError(
                f"--pp-layer-partition: {','.join(map(str, partition))} must be {pp_size} positive layer "
                f"counts that add up to the model's {num_layers} layers (as VLLM_PP_LAYER_PARTITION)"
            )
        return list(partition)
    if pp_size > num_layers:
        raise FleetInputError(
            f"--pipeline-parallel-size: {pp_size} stages for a model of {num_layers} layers; use at most "
            f"{num_layers}"
        )
    stages = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        stages[-i] += 1
    return stages


def _largest_stage_group(shape: KvShape, stages: list[int], group_size: int, groups: list[_Group]) -> int:
    """Layers per KV-cache group on the stage with the most (that stage has the fewest blocks)."""
    if len(stages) == 1:
        return group_size
    if len(groups) == 1:
        return max(stages)
    kinds = shape.layer_kinds
    if len(kinds) != shape.num_layers:  # MLP-only layers (Nemotron-H) hold no cache: spread evenly
        return max(math.ceil(group_size * layers / shape.num_layers) for layers in stages)
    largest, start = 0, 0
    for layers in stages:
        part = kinds[start : start + layers]
        start += layers
        for group in groups:
            largest = max(largest, math.ceil(part.count(group.kind) / group.count))
    return largest


# The release whose sliding-window reservation (`max_in_flight_tokens`) was read in its source and reproduced
# on real logs (tests/fixtures/gpu-h200-vllm-0.26.0-families: gpt-oss-20b and -120b).
_IN_FLIGHT_BATCHES_FROM = "0.26.0"


def _older_than(vllm_version: str, release: str) -> bool:
    return flags.release_key(vllm_version) < flags.release_key(release)


def _features(
    shape: KvShape, pp: int, dcp: int, mamba_cache_mode: str, prefix_off_by_model: bool, unified: bool
) -> list[str]:
    """What the plan counts, in the terms of `proven.PROVEN`: the layer kinds and the ways of counting."""
    kinds = list(dict.fromkeys(shape.layer_kinds or ("full",)))
    features = ["chunked_local_hybrid" if kind == "chunked" else kind for kind in kinds]
    if shape.attention_sinks:
        features.append("attention_sinks")
    if pp > 1:
        features.append("pipeline")
    if dcp > 1:
        features.append("decode_context_parallel")
    if shape.linear is not None and mamba_cache_mode == "all":
        features.append("mamba_cache_all")
    if prefix_off_by_model:
        features.append("prefix_caching_off_by_model")
    if unified:
        features.append("unified_as_full_attention")
    return features


def _hybrid_block_size(
    linear_page: int, per_layer_rank: int, block_size: int, mamba_cache_mode: str, shape: KvShape
) -> int:
    """The attention block size vLLM sets so one attention page holds a Mamba/GDN state
    (`Platform.update_block_size_for_backend`, vLLM 0.26): the smallest multiple of the kernel alignment,
    in "all" mode of lcm(Mamba chunk size, alignment)."""
    if not per_layer_rank:
        return block_size
    alignment = max(_HYBRID_BLOCK_ALIGNMENT, block_size)
    if mamba_cache_mode == "all" and shape.mamba_chunk_size:
        chunk = math.lcm(shape.mamba_chunk_size, alignment)
        return chunk * math.ceil(math.ceil(linear_page / per_layer_rank) / chunk)
    return alignment * math.ceil(linear_page / (alignment * per_layer_rank))


def _require_positive(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FleetInputError(f"{name}: {value!r} must be a positive integer")


def plan_capacity(
    model_config: dict[str, Any] | KvShape,
    *,
    tensor_parallel_size: int,
    kv_cache_dtype: str,
    max_model_len: int,
    kv_bytes_per_gpu: int,
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    avg_input_len: int | None = None,
    vllm_version: str | None = None,
    num_speculative_tokens: int = 0,
    mamba_cache_mode: str | None = None,
    enable_prefix_caching: bool | None = None,
    device: str = "GPU",
    dtype: str | None = None,
    pipeline_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    pp_layer_partition: list[int] | None = None,
    env: Mapping[str, str] | None = None,
    kv_transfer: bool = False,
    disable_hybrid_kv_cache_manager: bool | None = None,
) -> CapacityPlan:
    """Plan one instance's KV cache: the one capacity function (issue 34). `vllm-fleet plan`, render (and so
    preflight, deploy's expectations and verify) and monitoring all get their figures from it, for the release
    `vllm_install_version` installs (None: the newest catalogued), never a neighbour: a release missing from
    the flag catalog raises FleetInputError with the fix. Every size is per GPU (per TP rank), as vLLM's
    flags are.

    `block_size` None: vLLM's default on `device` for the release (kv_manager.default_block_size). `env`: the
    service's environment (vllm_service_extra_env), for the variables that steer the KV-cache manager;
    `kv_transfer`: a --kv-transfer-config is given (the CPU offload tier); `disable_hybrid_kv_cache_manager`:
    vLLM's flag (None: not given). Those decide whether the hybrid KV-cache manager stays on.

    `pipeline_parallel_size` splits the layers into stages the way `get_pp_indices` does (or as
    `pp_layer_partition`, VLLM_PP_LAYER_PARTITION, says); every stage gets `kv_bytes_per_gpu` and the pool
    has the block count of the stage that holds the most layers (vLLM takes the smallest count of all
    workers). `decode_context_parallel_size` shards each request's tokens over that many ranks: a full-
    attention layer needs `cdiv(cdiv(max_model_len, dcp), block_size)` blocks per request
    (`FullAttentionSpec.max_memory_usage_bytes`, vLLM 0.26).

    `mamba_cache_mode` None: the mode vLLM picks for this release from `enable_prefix_caching` (None: the
    flag left unset), see `default_mamba_cache_mode`.
    """
    shape = model_config if isinstance(model_config, KvShape) else KvShape.from_model_config(model_config)
    if vllm_version:
        flags.parse_version(vllm_version, "--vllm-version")  # refuse what is no release, naming the input
    release = flags.release(vllm_version or flags.newest_release()).version
    block_note = ""
    if block_size is None:
        block_size, block_note = kv_manager.default_block_size(device, release)
    env = dict(env or {})
    _require_positive("--tensor-parallel-size", tensor_parallel_size)
    _require_positive("--max-model-len", max_model_len)
    _require_positive("--kv-bytes-per-gpu", kv_bytes_per_gpu)
    _require_positive("--block-size", block_size)
    _require_positive("--max-num-batched-tokens", max_num_batched_tokens)
    _require_positive("--avg-input-len", avg_input_len)
    _require_positive("--pipeline-parallel-size", pipeline_parallel_size)
    _require_positive("--decode-context-parallel-size", decode_context_parallel_size)
    if num_speculative_tokens < 0:
        raise FleetInputError(f"--num-speculative-tokens: {num_speculative_tokens} must be 0 or more")
    if mamba_cache_mode is not None and mamba_cache_mode not in _MAMBA_CACHE_MODES:
        raise FleetInputError(
            f"--mamba-cache-mode: {mamba_cache_mode!r} must be 'none', 'align' or 'all' (or left unset: "
            "vLLM's default for the release)"
        )
    warnings: list[str] = [block_note] if block_note else []
    notes = list(shape.notes)
    unified = False
    if shape.mixes_attention_kinds or shape.linear is not None:
        hybrid_on, why = kv_manager.hybrid_manager(
            release,
            chunked_local=bool(shape.chunked_local_layers),
            env=env,
            device=device,
            kv_transfer=kv_transfer,
            disabled=disable_hybrid_kv_cache_manager,
        )
        if hybrid_on and why:
            notes.append(why)
        elif not hybrid_on and shape.linear is not None:
            warnings.append(
                "vLLM refuses to start this hybrid (Mamba / linear-attention) model without the hybrid "
                f"KV-cache manager, and {why}; planned as if it were on"
            )
        elif not hybrid_on:
            notes.append(f"every attention layer keeps the whole request: {why}")
            shape = shape.as_full_attention()
            unified = True
    kept, why = kv_manager.prefix_caching_kept(
        enable_prefix_caching, release, shape.architectures, hybrid=shape.linear is not None
    )
    prefix_off_by_model = kept is False and bool(enable_prefix_caching)
    if why:
        notes.append(why)
    if mamba_cache_mode is None:
        mamba_cache_mode = default_mamba_cache_mode(kept, release, shape.architectures)
    tp = tensor_parallel_size

    model_dtype = (dtype or shape.model_dtype).replace("torch.", "")
    if model_dtype not in _MODEL_DTYPE_BYTES:
        raise FleetInputError(
            f"--dtype / torch_dtype: {model_dtype!r} is not a dtype the planner knows; use bfloat16 or "
            f"float16"
        )
    if _MODEL_DTYPE_BYTES[model_dtype] == 4 and kv_cache_dtype == "auto":
        warnings.append(
            "the model is float32; vLLM serves float32 checkpoints in bfloat16 unless --dtype float32, so "
            "the "
            "KV cache is planned at 2 bytes"
        )
        model_dtype = "bfloat16"
    dtype_bytes = _kv_dtype_bytes(kv_cache_dtype, shape, model_dtype)
    act_bytes = _MODEL_DTYPE_BYTES[model_dtype]

    if not shape.is_mla:
        # the one TP-vs-heads rule (plan.model.check_heads): vLLM refuses what it refuses, so this raises
        for reason in check_heads(tp, shape.num_attention_heads, shape.num_kv_heads):
            if "replicates" in reason:
                warnings.append(reason)

    kv_heads = shape.kv_heads_per_rank(tp)
    per_layer_rank = shape.bytes_per_token_per_layer(kv_heads, kv_cache_dtype, dtype_bytes)
    per_layer_model = shape.bytes_per_token_per_layer(
        shape.num_kv_heads if not shape.is_mla else 1, kv_cache_dtype, dtype_bytes
    )
    per_token_rank = shape.attention_layers * per_layer_rank
    per_token_model = shape.attention_layers * per_layer_model
    per_token_full = shape.full_attention_layers * per_layer_model

    effective_block = block_size
    linear_page = 0
    state_blocks = 0
    if shape.linear is not None:
        linear_page = shape.linear.page_bytes(tp, act_bytes, num_speculative_tokens)
        effective_block = max(
            block_size, _hybrid_block_size(linear_page, per_layer_rank, block_size, mamba_cache_mode, shape)
        )
        if mamba_cache_mode == "all":  # MambaSpec.max_memory_usage_bytes: one state per block of the request
            state_blocks = math.ceil(max_model_len / effective_block) + num_speculative_tokens
        else:
            state_blocks = (2 if mamba_cache_mode == "align" else 1) + num_speculative_tokens
        # whether the family is counted exactly for this release is the "approximate" verdict's to say
        notes.append(
            f"linear-attention state {format_bytes(linear_page)} per layer per GPU (vLLM's "
            f"{shape.linear.vllm_shape}, state dtype {shape.linear.ssm_dtype or model_dtype}); attention "
            f"block size raised to {effective_block} tokens so one page holds it; {state_blocks} state "
            f"blocks per request per linear group ({mamba_cache_mode} mode)"
        )
    page = effective_block * per_layer_rank if shape.attention_layers else linear_page
    group_size, groups = _groups(shape)
    stages = pp_stage_layers(shape.num_layers, pipeline_parallel_size, pp_layer_partition)
    stage_group_size = _largest_stage_group(shape, stages, group_size, groups)
    bytes_per_block = stage_group_size * page
    num_blocks = kv_bytes_per_gpu // bytes_per_block
    if pipeline_parallel_size > 1:
        notes.append(
            f"pipeline stages hold {stages} layers; the pool has the block count of the largest "
            f"({stage_group_size} layers per KV-cache group there)"
        )
    dcp = decode_context_parallel_size

    batched = max_num_batched_tokens
    if (shape.sliding_window_layers or shape.chunked_local_layers) and batched is None:
        batched = _DEFAULT_ASSUMED_BATCHED_TOKENS
        warnings.append(
            f"sliding-window and chunked-local layers keep a window (chunk) plus max_num_batched_tokens "
            f"tokens; assumed {batched} "
            "(give --max-num-batched-tokens)"
        )

    # A sliding-window group holds window-1 tokens plus every batch still in flight: vLLM 0.26 reserves
    # `max_in_flight_tokens` = max_concurrent_batches x max_num_batched_tokens (`VllmConfig`), 2 batches
    # with async scheduling (its default) and one stage, else one per pipeline stage. Older releases
    # counted one batch.
    if batched is not None and not _older_than(release, _IN_FLIGHT_BATCHES_FROM):
        batched *= 2 if pipeline_parallel_size == 1 else pipeline_parallel_size

    def blocks_needed(tokens: int) -> int:
        return sum(
            group.count
            * _blocks_for(
                group,
                math.ceil(tokens / dcp) if group.kind == "full" else tokens,
                effective_block,
                shape,
                batched or 0,
                state_blocks,
            )
            for group in groups
        )

    per_request = blocks_needed(max_model_len)
    concurrency = num_blocks / per_request if per_request else 0.0
    group_aware = flags.supports(release, "kv_group_aware_report")
    num_groups = sum(group.count for group in groups)
    if group_aware:
        tokens = int(concurrency * max_model_len)
        formula = "int(num_blocks / blocks_per_request * max_model_len) (vLLM >= 0.20.1)"
    else:
        tokens = num_blocks // num_groups * effective_block
        formula = "num_blocks // kv_cache_groups * block_size (vLLM < 0.20.1)"
        if not flags.supports(release, "max_concurrency_from_blocks"):
            concurrency = tokens / max_model_len
    fits = num_blocks >= per_request

    # The longest request the pool can hold: grow it block by block over the full-attention groups.
    low, high = 0, max(max_model_len, num_blocks * effective_block) + effective_block
    while low < high:
        middle = (low + high + 1) // 2
        if blocks_needed(middle) <= num_blocks:
            low = middle
        else:
            high = middle - 1
    estimated_max_len = low

    offload = 0
    if not fits:
        offload = max(0, max_model_len - estimated_max_len) * per_token_full
        warnings.append(
            f"one request of max_model_len {format_count(max_model_len)} needs {format_count(per_request)} "
            f"KV blocks ({per_request * bytes_per_block / 2**30:.2f} GiB, as vLLM counts it) "
            f"per GPU but {format_bytes(kv_bytes_per_gpu)} per GPU holds {format_count(num_blocks)}: "
            f"vLLM refuses to start ('To serve at least one request with the model's max seq len'); the "
            f"longest request that fits is about {format_count(estimated_max_len)} tokens. A CPU offload "
            f"tier "
            f"would have to hold {format_bytes(offload)} ({format_count(offload)} bytes, all GPUs together) "
            "for the rest, but vLLM's OffloadingConnector only keeps evicted prefix blocks and does not lift "
            "that start-up check: raise the KV memory, add GPUs, use a smaller KV dtype or lower "
            "max_model_len"
        )
    chunks = None
    if max_num_batched_tokens is not None:
        chunks = math.ceil(max_model_len / max_num_batched_tokens)
    avg_concurrency = None
    if avg_input_len is not None:
        avg_concurrency = num_blocks / blocks_needed(avg_input_len)

    approximate = proven.unproven(
        _features(shape, pipeline_parallel_size, dcp, mamba_cache_mode, prefix_off_by_model, unified), release
    )
    if approximate:
        warnings.append("approximate: " + "; ".join(approximate))
    line = (
        f"{device} KV cache size: {format_count(tokens)} tokens, Maximum concurrency for "
        f"{format_count(max_model_len)} tokens per request: {concurrency:.2f}x"
    )
    expectations = {
        "kv_cache_tokens": tokens,
        "max_concurrency": round(concurrency, 2),
        "max_model_len": max_model_len,
        "kv_cache_dtype": kv_cache_dtype,
    }
    return CapacityPlan(
        model_type=shape.model_type,
        device=device,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pipeline_parallel_size,
        decode_context_parallel_size=dcp,
        exact=not approximate,
        approximate_because=approximate,
        kv_cache_dtype=kv_cache_dtype,
        kv_dtype_bytes=dtype_bytes,
        max_model_len=max_model_len,
        kv_bytes_per_gpu=kv_bytes_per_gpu,
        block_size=effective_block,
        num_gpu_blocks=num_blocks,
        kv_heads_per_gpu=kv_heads,
        attention_layers=shape.attention_layers,
        full_attention_layers=shape.full_attention_layers,
        sliding_window_layers=shape.sliding_window_layers,
        linear_attention_layers=shape.linear_attention_layers,
        kv_bytes_per_token=per_token_model,
        kv_bytes_per_token_per_gpu=per_token_rank,
        kv_bytes_per_token_full_attention=per_token_full,
        linear_state_bytes_per_request_per_gpu=shape.linear_attention_layers * linear_page * state_blocks,
        blocks_per_request=per_request,
        gpu_kv_tokens=tokens,
        max_concurrency=concurrency,
        fits_on_gpu=fits,
        estimated_max_model_len=estimated_max_len,
        offload_bytes_needed=offload,
        kv_bytes_needed_per_request=per_request * bytes_per_block,
        prefill_chunks=chunks,
        max_num_batched_tokens=max_num_batched_tokens,
        avg_input_len=avg_input_len,
        concurrency_at_avg_input_len=avg_concurrency,
        token_formula=formula,
        kv_cache_line=line,
        expectations=expectations,
        warnings=warnings,
        notes=notes,
        chunked_local_layers=shape.chunked_local_layers,
    )


def format_plan(plan: CapacityPlan) -> str:
    """The human-readable report of `vllm-fleet plan`."""
    rows = [
        f"model type            {plan.model_type} ({plan.full_attention_layers} full-attention, "
        f"{plan.sliding_window_layers} sliding-window, "
        + (f"{plan.chunked_local_layers} chunked-local, " if plan.chunked_local_layers else "")
        + f"{plan.linear_attention_layers} linear-attention layers)",
        f"KV per token          {format_count(plan.kv_bytes_per_token)} B whole model, "
        f"{format_count(plan.kv_bytes_per_token_per_gpu)} B per GPU "
        f"({plan.kv_heads_per_gpu} KV heads per GPU, {plan.kv_cache_dtype} = {plan.kv_dtype_bytes} B)",
        f"KV memory per {plan.device:<7} {format_bytes(plan.kv_bytes_per_gpu)} -> "
        f"{format_count(plan.num_gpu_blocks)} blocks "
        f"of {plan.block_size} tokens",
        f"{plan.device + ' KV tokens':<22}{format_count(plan.gpu_kv_tokens)} "
        f"(TP {plan.tensor_parallel_size}, PP {plan.pipeline_parallel_size}, "
        f"DCP {plan.decode_context_parallel_size}) {'exact' if plan.exact else 'APPROXIMATE'}",
        f"max concurrency       {plan.max_concurrency:.2f}x at {format_count(plan.max_model_len)} tokens",
        f"{'fits on ' + plan.device:<22}{'yes' if plan.fits_on_gpu else 'NO'}"
        + (
            ""
            if plan.fits_on_gpu
            else f" (longest request ~{format_count(plan.estimated_max_model_len)} tokens)"
        ),
    ]
    if not plan.fits_on_gpu:
        rows.append(
            f"CPU tier needed       {format_bytes(plan.offload_bytes_needed)} "
            f"({format_count(plan.offload_bytes_needed)} B)"
        )
    if plan.prefill_chunks is not None:
        rows.append(
            f"prefill chunks        {plan.prefill_chunks} of "
            f"{format_count(plan.max_num_batched_tokens or 0)} tokens"
        )
    if plan.concurrency_at_avg_input_len is not None:
        rows.append(
            f"concurrency at avg    {plan.concurrency_at_avg_input_len:.2f}x at "
            f"{format_count(plan.avg_input_len or 0)} tokens"
        )
    rows.append(f"expected log line     {plan.kv_cache_line}")
    rows.extend(f"warning: {text}" for text in plan.warnings)
    return "\n".join(rows)
