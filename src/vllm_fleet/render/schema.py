"""The instance schema: the structured `vllm_service_*` inventory variables that describe one `vllm serve`.

Every setting is its own typed variable (never a pre-joined command string), so the renderer can spell it
for the target vLLM release and the validator can reason about it. `ServeSpec.from_vars(vars)` reads the
variables (with or without the `vllm_service_` prefix) and raises FleetInputError naming the variable, the
value and the fix. `None` means "leave vLLM's default" (or, for TP / port / custom all-reduce, "take it from
the layout").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import parse_human_int, parse_size

PREFIX = "vllm_service_"

# Offloading keys that look like top-level OffloadingConnector settings but belong to the `fs` tier.
FS_TIER_KEYS = ("root_dir", "n_read_threads", "n_write_threads")
EVICTION_POLICIES_HINT = "lru or arc"


@dataclass(frozen=True)
class FsTier:
    """The OffloadingConnector's `fs` secondary tier (vLLM >= 0.25: TieringOffloadingSpec)."""

    root_dir: str
    n_read_threads: int | None = None
    n_write_threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_tier(self) -> dict[str, Any]:
        tier: dict[str, Any] = {"type": "fs", "root_dir": self.root_dir}
        if self.n_read_threads is not None:
            tier["n_read_threads"] = self.n_read_threads
        if self.n_write_threads is not None:
            tier["n_write_threads"] = self.n_write_threads
        tier.update(self.extra)
        return tier


@dataclass(frozen=True)
class ServeSpec:
    """One `vllm serve` command, as inventory variables describe it (sizes in bytes, lengths in tokens)."""

    model: str
    served_model_name: tuple[str, ...] = ()
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    scheduler_reserve_full_isl: bool | None = None
    kv_offload_cpu_bytes: int | None = None
    kv_offload_eviction_policy: str | None = None
    kv_offload_prompt_only: bool | None = None
    kv_offload_fs_tier: FsTier | None = None
    kv_offload_extra_config: dict[str, Any] = field(default_factory=dict)
    speculative_config: dict[str, Any] = field(default_factory=dict)
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    limit_mm_per_prompt: dict[str, Any] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    mm_ipc_gpu_memory_gb: float | None = None
    compilation_config: dict[str, Any] = field(default_factory=dict)
    enforce_eager: bool = False
    disable_custom_all_reduce: bool | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    enable_prompt_tokens_details: bool = False
    host: str | None = None
    port: int | None = None
    api_key: str | None = field(default=None, repr=False)
    avg_input_len: int | None = None
    extra_args: tuple[str, ...] = ()
    venv: str = "/opt/vllm-fleet/venv"
    numactl_path: str = "/usr/bin/numactl"

    @classmethod
    def from_vars(cls, variables: dict[str, Any]) -> ServeSpec:
        """Read `vllm_service_*` variables (unknown `vllm_service_*` names of other concerns are ignored)."""
        if not isinstance(variables, dict):
            raise FleetInputError(
                "vllm_service variables: expected a mapping of vllm_service_* names, got "
                f"{type(variables).__name__}"
            )
        raw = {
            (k[len(PREFIX) :] if k.startswith(PREFIX) else k): v
            for k, v in variables.items()
            if isinstance(k, str)
        }
        reader = _Reader(raw)
        model = reader.str_("model")
        if not model:
            raise FleetInputError(
                "vllm_service_model: not set; give the model directory on the host (or a Hugging Face id), "
                "e.g. vllm_service_model: /data/vllm_models/Qwen3-27B"
            )
        spec = cls(
            model=model,
            served_model_name=reader.names("served_model_name"),
            tensor_parallel_size=reader.int_("tensor_parallel_size", minimum=1),
            max_model_len=reader.human_int("max_model_len", minimum=1),
            dtype=reader.str_("dtype"),
            kv_cache_dtype=reader.str_("kv_cache_dtype"),
            kv_cache_memory_bytes=reader.size("kv_cache_memory_bytes"),
            gpu_memory_utilization=reader.float_("gpu_memory_utilization", low=0.0, high=1.0),
            enable_prefix_caching=reader.bool_("enable_prefix_caching"),
            enable_chunked_prefill=reader.bool_("enable_chunked_prefill"),
            max_num_batched_tokens=reader.human_int("max_num_batched_tokens", minimum=1),
            max_num_seqs=reader.int_("max_num_seqs", minimum=1),
            scheduler_reserve_full_isl=reader.bool_("scheduler_reserve_full_isl"),
            kv_offload_cpu_bytes=reader.size("kv_offload_cpu_bytes"),
            kv_offload_eviction_policy=reader.str_("kv_offload_eviction_policy"),
            kv_offload_prompt_only=reader.bool_("kv_offload_prompt_only"),
            kv_offload_fs_tier=reader.fs_tier("kv_offload_fs_tier"),
            kv_offload_extra_config=reader.dict_("kv_offload_extra_config"),
            speculative_config=reader.dict_("speculative_config"),
            rope_scaling=reader.dict_("rope_scaling"),
            hf_overrides=reader.dict_("hf_overrides"),
            limit_mm_per_prompt=reader.dict_("limit_mm_per_prompt"),
            mm_processor_kwargs=reader.dict_("mm_processor_kwargs"),
            mm_ipc_gpu_memory_gb=reader.float_("mm_ipc_gpu_memory_gb", low=0.0),
            compilation_config=reader.dict_("compilation_config"),
            enforce_eager=bool(reader.bool_("enforce_eager")),
            disable_custom_all_reduce=reader.bool_("disable_custom_all_reduce"),
            reasoning_parser=reader.str_("reasoning_parser"),
            tool_call_parser=reader.str_("tool_call_parser"),
            enable_auto_tool_choice=bool(reader.bool_("enable_auto_tool_choice")),
            enable_prompt_tokens_details=bool(reader.bool_("enable_prompt_tokens_details")),
            host=reader.str_("host"),
            port=reader.int_("port", minimum=1, maximum=65535),
            api_key=reader.str_("api_key"),
            avg_input_len=reader.human_int("avg_input_len", minimum=1),
            extra_args=reader.args("extra_args"),
            venv=reader.str_("venv") or cls.venv,
            numactl_path=reader.str_("numactl_path") or cls.numactl_path,
        )
        _check_offload_keys(spec)
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON, the API key masked (it must never reach a log or an instance plan)."""
        data = asdict(self)
        if data.get("api_key"):
            data["api_key"] = "********"
        return data

    @property
    def num_speculative_tokens(self) -> int:
        value = self.speculative_config.get("num_speculative_tokens", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _check_offload_keys(spec: ServeSpec) -> None:
    """The seed put the fs tier's thread counts at the connector's top level, where vLLM ignores them."""
    misplaced = [k for k in FS_TIER_KEYS if k in spec.kv_offload_extra_config]
    if misplaced:
        raise FleetInputError(
            f"vllm_service_kv_offload_extra_config: {', '.join(misplaced)} are not OffloadingConnector "
            "top-level keys (vLLM ignores them there); they are arguments of its `fs` secondary tier: set "
            "vllm_service_kv_offload_fs_tier: {root_dir: /path, n_read_threads: 16, n_write_threads: 4}"
        )
    if spec.kv_offload_cpu_bytes is None and (
        spec.kv_offload_fs_tier or spec.kv_offload_eviction_policy or spec.kv_offload_prompt_only is not None
    ):
        raise FleetInputError(
            "vllm_service_kv_offload_cpu_bytes: not set, but other vllm_service_kv_offload_* variables "
            "are; the "
            "OffloadingConnector needs the CPU tier's size (bytes across all workers), e.g. 200GiB"
        )


class _Reader:
    """Typed reads of raw variables; every error names `vllm_service_<name>`."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def _get(self, name: str) -> Any:
        value = self.raw.get(name)
        return None if value == "" else value

    @staticmethod
    def _fail(name: str, value: Any, expected: str) -> FleetInputError:
        return FleetInputError(f"{PREFIX}{name}: {value!r} is not {expected}")

    def str_(self, name: str) -> str | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, (dict, list, bool)):
            raise self._fail(name, value, "a string; give one plain value")
        return str(value)

    def int_(self, name: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self._fail(name, value, "an integer")
        try:
            number = int(value)
        except ValueError:
            raise self._fail(name, value, "an integer") from None
        return self._bounded(name, number, minimum, maximum)

    def _bounded(self, name: str, number: int, minimum: int | None, maximum: int | None) -> int:
        if minimum is not None and number < minimum:
            raise self._fail(name, number, f"allowed: give at least {minimum}")
        if maximum is not None and number > maximum:
            raise self._fail(name, number, f"allowed: give at most {maximum}")
        return number

    def human_int(self, name: str, minimum: int | None = None) -> int | None:
        value = self._get(name)
        if value is None:
            return None
        return self._bounded(name, parse_human_int(value, f"{PREFIX}{name}"), minimum, None)

    def size(self, name: str) -> int | None:
        value = self._get(name)
        if value is None:
            return None
        return parse_size(value, f"{PREFIX}{name}")

    def float_(self, name: str, low: float | None = None, high: float | None = None) -> float | None:
        value = self._get(name)
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
        except (TypeError, ValueError):
            raise self._fail(name, value, "a number") from None
        if (low is not None and number < low) or (high is not None and number > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self._fail(name, value, f"{bounds}; give a number in that range")
        return number

    def bool_(self, name: str) -> bool | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise self._fail(name, value, "a boolean; give true or false (or leave it unset for vLLM's default)")

    def dict_(self, name: str) -> dict[str, Any]:
        value = self._get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._fail(name, value, "a mapping; give YAML keys (not a JSON string), e.g. {image: 40}")
        return dict(value)

    def names(self, name: str) -> tuple[str, ...]:
        value = self._get(name)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if value == []:
            return ()
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            return tuple(value)
        raise self._fail(name, value, "a name or a list of names")

    def args(self, name: str) -> tuple[str, ...]:
        value = self._get(name)
        if value is None:
            return ()
        if isinstance(value, str):
            raise self._fail(
                name,
                value,
                "a list; give one list item per argv word, e.g. ['--dtype', 'bfloat16'] (a joined string "
                "would need shell splitting, which systemd does differently)",
            )
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise self._fail(name, value, "a list of strings")
        return tuple(str(v) for v in value)

    def fs_tier(self, name: str) -> FsTier | None:
        value = self._get(name)
        if value is None:
            return None
        if not isinstance(value, dict) or not value.get("root_dir"):
            raise self._fail(
                name, value, "a mapping with root_dir, e.g. {root_dir: /nvme/kv, n_read_threads: 16}"
            )
        extra = {k: v for k, v in value.items() if k not in FS_TIER_KEYS and k != "type"}
        threads = {}
        for key in ("n_read_threads", "n_write_threads"):
            if value.get(key) is not None:
                if isinstance(value[key], bool) or not isinstance(value[key], int) or value[key] < 1:
                    raise self._fail(f"{name}.{key}", value[key], "a positive integer")
                threads[key] = value[key]
        return FsTier(root_dir=str(value["root_dir"]), extra=extra, **threads)


def variable_names() -> list[str]:
    """Every public variable of the schema, prefixed (defaults/main.yml and argument_specs must list them)."""
    return [PREFIX + f.name for f in fields(ServeSpec)]
