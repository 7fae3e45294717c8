"""The fixed per-request state of linear-attention and Mamba layers, read from a model's config.json the way
vLLM's `MambaStateShapeCalculator` / `MambaStateDtypeCalculator` shape it (`plan.capacity` sizes the pool).

    LinearAttentionState, MambaState             .page_bytes(tp, conv_bytes, num_speculative_tokens)
    linear_state(info, source) -> LinearAttentionState | MambaState | None
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.errors import FleetInputError
from vllm_fleet.plan.model import ModelInfo
from vllm_fleet.plan.model import _int as _int

MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class LinearAttentionState:
    """Shape of one Gated-DeltaNet layer's recurrent state (Qwen3-Next, Qwen3.5), or of a KDA layer's."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str | None
    vllm_shape: str = "gated_delta_net_state_shape"  # the MambaStateShapeCalculator function it follows

    def page_bytes(self, tensor_parallel_size: int, conv_bytes: int, num_speculative_tokens: int) -> int:
        """Bytes of one layer's state on one GPU (`gated_delta_net_state_shape` in vLLM)."""
        tp = tensor_parallel_size
        conv_dim = self.key_head_dim * self.num_key_heads * 2 + self.value_head_dim * self.num_value_heads
        conv = (conv_dim // tp) * (self.conv_kernel - 1 + num_speculative_tokens) * conv_bytes
        ssm_bytes = MODEL_DTYPE_BYTES.get(self.ssm_dtype or "", conv_bytes)
        temporal = (self.num_value_heads // tp) * self.key_head_dim * self.value_head_dim * ssm_bytes
        return conv + temporal


@dataclass(frozen=True)
class MambaState:
    """One Mamba layer's state (`MambaStateShapeCalculator.mamba2_state_shape` / `mamba1_state_shape`)."""

    kind: str  # mamba2 | mamba1
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    intermediate_size: int
    ssm_dtype: str | None

    @property
    def vllm_shape(self) -> str:
        return f"{self.kind}_state_shape"

    def page_bytes(self, tensor_parallel_size: int, conv_bytes: int, num_speculative_tokens: int) -> int:
        tp = tensor_parallel_size
        ssm_bytes = MODEL_DTYPE_BYTES.get(self.ssm_dtype or "", conv_bytes)
        if self.kind == "mamba1":
            conv = (
                (self.intermediate_size // tp) * (self.conv_kernel - 1 + num_speculative_tokens) * conv_bytes
            )
            return conv + (self.intermediate_size // tp) * self.state_size * ssm_bytes
        # n_groups that do not divide over TP are replicated so that every head's group is local.
        groups = self.n_groups if self.n_groups % tp == 0 else self.n_groups + tp - self.n_groups
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = (conv_dim // tp) * (self.conv_kernel - 1 + num_speculative_tokens) * conv_bytes
        return conv + (self.num_heads // tp) * self.head_dim * self.state_size * ssm_bytes


def _mamba2_state(info: ModelInfo, source: str) -> MambaState:
    cfg = info.raw

    def pick(*names: str, default: int | None = None) -> int:
        return _int(cfg, names, source, default=default)

    heads = pick("mamba_n_heads", "mamba_num_heads")
    head_dim = pick("mamba_d_head", "mamba_head_dim")
    return MambaState(
        kind="mamba2",
        num_heads=heads,
        head_dim=head_dim,
        state_size=pick("mamba_d_state", "ssm_state_size", "state_size"),
        n_groups=pick("mamba_n_groups", "n_groups", default=1),
        conv_kernel=pick("mamba_d_conv", "conv_kernel", default=4),
        intermediate_size=heads * head_dim,
        ssm_dtype=_mamba2_ssm_dtype(info),
    )


def _mamba2_ssm_dtype(info: ModelInfo) -> str | None:
    """The SSM state's dtype: Nemotron-H keeps it in the config's `mamba_ssm_cache_dtype`, float32 when the
    config names none (`NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype`, vLLM 0.26); other models
    in the model dtype unless the config says otherwise."""
    cfg = info.raw
    if info.model_type == "nemotron_h":
        named = cfg.get("mamba_ssm_cache_dtype")
        return named if isinstance(named, str) and named != "auto" else "float32"
    return cfg.get("mamba_ssm_dtype") if isinstance(cfg.get("mamba_ssm_dtype"), str) else None


def _mamba1_state(info: ModelInfo, source: str) -> MambaState:
    cfg = info.raw
    hidden = info.hidden_size or 0
    expand = cfg.get("mamba_expand", 2)
    return MambaState(
        kind="mamba1",
        num_heads=0,
        head_dim=0,
        state_size=_int(cfg, ("mamba_d_state", "state_size"), source, default=16),
        n_groups=0,
        conv_kernel=_int(cfg, ("mamba_d_conv", "conv_kernel"), source, default=4),
        intermediate_size=int(hidden * expand),
        ssm_dtype=cfg.get("mamba_ssm_dtype") if isinstance(cfg.get("mamba_ssm_dtype"), str) else None,
    )


def _kda_state(info: ModelInfo, source: str) -> LinearAttentionState:
    attn = info.raw.get("linear_attn_config") or {}
    heads = _int(attn, ("num_heads",), source + " linear_attn_config")
    dim = _int(attn, ("head_dim",), source + " linear_attn_config")
    # KDA keeps q, k, v short-conv states and a (head_dim x head_dim) state per head, like Gated DeltaNet
    # with as many key as value heads.
    return LinearAttentionState(
        num_key_heads=heads,
        num_value_heads=heads,
        key_head_dim=dim,
        value_head_dim=dim,
        conv_kernel=_int(attn, ("short_conv_kernel_size",), source + " linear_attn_config", default=4),
        # the recurrent state is always float32 (`MambaStateDtypeCalculator.kda_state_dtype`, vLLM 0.26)
        ssm_dtype="float32",
        vllm_shape="kda_state_shape",
    )


def linear_state(info: ModelInfo, source: str) -> LinearAttentionState | MambaState | None:
    """The recurrent state of the model's non-attention layers (one kind per model), None without any."""
    cfg = info.raw
    kinds = info.layer_kinds
    linear: LinearAttentionState | MambaState | None = None
    if "linear" in kinds:
        linear = LinearAttentionState(
            num_key_heads=_int(cfg, ("linear_num_key_heads",), source),
            num_value_heads=_int(cfg, ("linear_num_value_heads",), source),
            key_head_dim=_int(cfg, ("linear_key_head_dim",), source),
            value_head_dim=_int(cfg, ("linear_value_head_dim",), source),
            conv_kernel=_int(cfg, ("linear_conv_kernel_dim", "conv_kernel"), source, default=4),
            ssm_dtype=cfg.get("mamba_ssm_dtype") if isinstance(cfg.get("mamba_ssm_dtype"), str) else None,
        )
    elif "mamba" in kinds:
        linear = _mamba2_state(info, source)
    elif "mamba1" in kinds:
        linear = _mamba1_state(info, source)
    elif "kda" in kinds:
        linear = _kda_state(info, source)
    elif "short_conv" in kinds:
        raise FleetInputError(
            f"{source}: layer_types has short-conv layers (LFM2), which the planner does not size; "
            "check the real log with `vllm-fleet logcheck`"
        )
    return linear
