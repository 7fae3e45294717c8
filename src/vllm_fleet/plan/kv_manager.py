"""The KV-cache manager's choices that change the capacity vLLM reports, release by release, as vLLM makes
them.

    default_block_size(device, vllm_version) -> (int, note)
    hybrid_manager(vllm_version, *, chunked_local, env, device, kv_transfer, disabled) -> (on, why)
    prefix_caching_kept(asked, vllm_version, architectures, hybrid) -> (bool | None, why)
    default_mamba_cache_mode(enable_prefix_caching, vllm_version, architectures) -> str
    env_flag(env, name, default) -> bool

Each function follows the vLLM code it names (read in the release wheels' sources that
scripts/gen_flag_catalog.py caches, /var/cache/vllm-fleet-wheels/src/<release>/); the plan reads the
environment from `vllm_service_extra_env` (render) or `vllm-fleet plan --env NAME=VALUE`, never from its
own process.
"""

from __future__ import annotations

from collections.abc import Mapping

from vllm_fleet import flags
from vllm_fleet.errors import FleetInputError

# The architectures that declare SupportsMambaPrefixCaching (vLLM 0.26.0's model_executor/models/: falcon_h1,
# granitemoehybrid, jamba, mamba, mamba2, nemotron_h, zamba2): with prefix caching on, releases before 0.28.0
# give them mamba_cache_mode "all", every other hybrid "align".
_MAMBA_PREFIX_CACHING_ARCHITECTURES = frozenset(
    {
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "JambaForCausalLM",
        "MambaForCausalLM",
        "Mamba2ForCausalLM",
        "NemotronHForCausalLM",
        "Zamba2ForCausalLM",
    }
)
# The block size vLLM takes when `--block-size` is not given, per device, from the first release it holds in:
# - GPU: CacheConfig's 16, and 64 from 0.34.0 (`CacheConfig.DEFAULT_BLOCK_SIZE`, vllm/config/cache.py; every
#   CUDA attention backend of the catalog accepts it, `AttentionBackend.get_preferred_block_size`);
# - CPU: `CpuPlatform.check_and_update_config` (vllm/platforms/cpu.py) sets 128 (before 0.11.1 only with
#   intel_extension_for_pytorch, else 16); 0.33.0 drops that, and the CPU attention backend, which takes
#   multiples of 32 only (`CPUAttentionBackend.get_supported_kernel_block_sizes`), turns the default 16
#   into 32 (`get_preferred_block_size`: the smallest supported size); 0.34.0's default 64 is kept.
_DEFAULT_BLOCK_SIZES = {
    "GPU": (("0.0.0", 16), ("0.34.0", 64)),
    "CPU": (("0.0.0", 128), ("0.33.0", 32), ("0.34.0", 64)),
}
_CPU_128_WITHOUT_IPEX_FROM = "0.11.1"
CHUNKED_LOCAL_ENV = "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"
# `VllmConfig.__post_init__` (vllm/config.py 0.10.0): the hybrid manager stays on for chunked-local attention
# (Llama 4) unless speculative decoding uses EAGLE (not followed, see hybrid_manager). From 0.10.1 it is
# switched off unless CHUNKED_LOCAL_ENV is 1 ("There is a latency regression when using chunked local
# attention with the hybrid KV cache manager", vllm/config/vllm.py 0.12.0), and from 0.14.0 that variable
# defaults to 1 (vllm/envs.py 0.14.0: `"1"`).
_CHUNKED_LOCAL_ENV_FROM = "0.10.1"
_CHUNKED_LOCAL_ENV_DEFAULT_ON_FROM = "0.14.0"
# Before 0.22.0 any --kv-transfer-config turns the hybrid manager off ("Turning off hybrid kv cache manager
# because `--kv-transfer-config` is set", vllm/config/vllm.py 0.12.0-0.21.0); from 0.22.0 only a connector
# without SupportsHMA does (`KVConnectorFactory.supports_hma_config`), and the OffloadingConnector has it
# (`class OffloadingConnector(KVConnectorBase_V1, SupportsHMA)`, offloading_connector.py 0.22.0).
_HYBRID_MANAGER_WITH_KV_TRANSFER_FROM = "0.22.0"
# Before 0.10.2 only CUDA and ROCm keep it (`current_platform.is_cuda() or current_platform.is_rocm()`); from
# 0.10.2 `CpuPlatform.support_hybrid_kv_cache` returns True.
_HYBRID_MANAGER_ON_CPU_FROM = "0.10.2"
# `MambaModelConfig.verify_and_update_config` (vllm/model_executor/models/config.py): before 0.11.1 every
# hybrid model loses prefix caching ("Hybrid or mamba-based model detected: disabling prefix caching"); from
# 0.11.1 only models without `supports_mamba_prefix_caching` do ("... without support for prefix caching:
# disabling", logged by vLLM 0.13.0 for Qwen3-Next), until 0.15.0 gives every other hybrid mamba_cache_mode
# "align" instead (the same function, 0.15.0: `"all" if model_config.supports_mamba_prefix_caching else
# "align"`).
_PREFIX_CACHING_FOR_SUPPORTING_MODELS_FROM = "0.11.1"
_ALIGN_FOR_EVERY_HYBRID_FROM = "0.15.0"
# The models that declare SupportsMambaPrefixCaching in 0.11.1-0.14.1 (vllm/model_executor/models/*.py): those
# of 0.26.0 and Bamba (still in 0.20.0, gone by 0.26.0; default_mamba_cache_mode uses 0.26.0's set, so
# Bamba on 0.15.0-0.25.x is planned "align" where vLLM takes "all": a known gap, no Bamba log here).
_MAMBA_PREFIX_CACHING_ARCHITECTURES_0_11 = _MAMBA_PREFIX_CACHING_ARCHITECTURES | {"BambaForCausalLM"}


def default_block_size(device: str, vllm_version: str) -> tuple[int, str]:
    """The block size vLLM uses when `--block-size` is not given on this device word (GPU, CPU), and a note
    where it depends on what the host has installed."""
    try:
        steps = _DEFAULT_BLOCK_SIZES[device.upper()]
    except KeyError:
        raise FleetInputError(
            f"--device: {device!r} is not a device the planner knows; use GPU or CPU (the word of vLLM's "
            "'<device> KV cache size' line)"
        ) from None
    size = [size for since, size in steps if not _before(vllm_version, since)][-1]
    if device.upper() == "CPU" and _before(vllm_version, _CPU_128_WITHOUT_IPEX_FROM):
        return size, (
            f"vLLM {vllm_version}'s CPU backend uses 128-token blocks with intel_extension_for_pytorch "
            "installed, else 16: planned with 128 (give --block-size to say which)"
        )
    return size, ""


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean variable as vLLM's envs.py reads it: `bool(int(os.getenv(name, default)))`."""
    text = env.get(name)
    if text is None:
        return default
    try:
        return bool(int(str(text).strip()))
    except ValueError:
        raise FleetInputError(
            f"{name}: {text!r} is not 0 or 1; vLLM reads it with int() and would refuse to start. Set it to "
            "0 or 1 in vllm_service_extra_env (or --env)"
        ) from None


def _before(vllm_version: str, release: str) -> bool:
    return flags.release_key(vllm_version) < flags.release_key(release)


def hybrid_manager(
    vllm_version: str,
    *,
    chunked_local: bool,
    env: Mapping[str, str],
    device: str = "GPU",
    kv_transfer: bool = False,
    disabled: bool | None = None,
) -> tuple[bool, str]:
    """Whether vLLM keeps the hybrid KV-cache manager (`VllmConfig.__post_init__`). Off, a model mixing
    full attention with sliding-window or chunked-local layers is sized as full attention in every layer
    (`unify_hybrid_kv_cache_specs`), and a Mamba / linear-attention hybrid cannot start.

    Not followed: vLLM also turns it off for chunked-local attention with an EAGLE-family drafter
    (`speculative_config.use_eagle()`, whose methods change from release to release); such a plan keeps the
    manager on and is approximate anyway (no Llama 4 log proves it)."""
    if disabled:
        return False, "--disable-hybrid-kv-cache-manager in vllm_service_extra_args"
    if device.upper() == "CPU" and _before(vllm_version, _HYBRID_MANAGER_ON_CPU_FROM):
        return False, f"vLLM {vllm_version} keeps the hybrid KV-cache manager to CUDA and ROCm"
    if kv_transfer and _before(vllm_version, _HYBRID_MANAGER_WITH_KV_TRANSFER_FROM):
        return False, (
            f"vLLM {vllm_version} turns the hybrid KV-cache manager off for --kv-transfer-config (the CPU "
            "offload tier, vllm_service_kv_offload_cpu_bytes)"
        )
    if not chunked_local:
        return True, ""
    if _before(vllm_version, _CHUNKED_LOCAL_ENV_FROM):
        return True, ""
    default = not _before(vllm_version, _CHUNKED_LOCAL_ENV_DEFAULT_ON_FROM)
    on = env_flag(env, CHUNKED_LOCAL_ENV, default)
    given = (
        f"{CHUNKED_LOCAL_ENV}={env[CHUNKED_LOCAL_ENV]}"
        if CHUNKED_LOCAL_ENV in env
        else (f"{CHUNKED_LOCAL_ENV} unset (vLLM {vllm_version} defaults it to {int(default)})")
    )
    if on:
        return True, f"chunked-local layers keep a chunk each under the hybrid KV-cache manager ({given})"
    return False, (
        f"chunked-local layers are sized as full attention: vLLM {vllm_version} switches the hybrid KV-cache "
        f"manager off for them ({given})"
    )


def prefix_caching_kept(
    asked: bool | None, vllm_version: str, architectures: tuple[str, ...], hybrid: bool
) -> tuple[bool | None, str]:
    """Prefix caching as vLLM leaves it for a hybrid (Mamba / linear-attention) model, before the release
    where every hybrid keeps it; `asked` None (left unset) and non-hybrid models are returned as they are."""
    if not hybrid or not asked or not _before(vllm_version, _ALIGN_FOR_EVERY_HYBRID_FROM):
        return asked, ""
    if _before(vllm_version, _PREFIX_CACHING_FOR_SUPPORTING_MODELS_FROM) or not (
        _MAMBA_PREFIX_CACHING_ARCHITECTURES_0_11 & set(architectures)
    ):
        return False, (
            f"prefix caching switched off by vLLM {vllm_version} for this hybrid model (it logs 'Hybrid or "
            "mamba-based model detected ... disabling'): one state per request"
        )
    return asked, ""


def default_mamba_cache_mode(
    enable_prefix_caching: bool | None, vllm_version: str | None, architectures: tuple[str, ...] = ()
) -> str:
    """The `mamba_cache_mode` vLLM settles on for a hybrid model when `--mamba-cache-mode` is not given.

    `enable_prefix_caching` None means the user left it unset: vLLM's `_set_default_chunked_prefill_and_
    prefix_caching_args` then leaves it off for hybrids before 0.28.0 (0.26.0: "keep it opt-in"; the H200
    log's cache_config_info says enable_prefix_caching="False", mamba_cache_mode="none") and on from 0.28.0
    (vLLM PR #50991). `MambaModelConfig.verify_and_update_config` turns prefix caching into "all" for the
    architectures that support it before 0.28.0, into "align" otherwise."""
    if enable_prefix_caching is None:
        enable_prefix_caching = flags.supports(vllm_version, "hybrid_prefix_caching_by_default")
    if not enable_prefix_caching:
        return "none"
    if not flags.supports(vllm_version, "hybrid_prefix_caching_by_default") and (
        _MAMBA_PREFIX_CACHING_ARCHITECTURES & set(architectures)
    ):
        return "all"
    return "align"
