"""The instance schema: the structured `vllm_service_*` inventory variables that describe one `vllm serve`.

Every setting is its own typed variable (never a pre-joined command string), so the renderer can spell it
for the target vLLM release and the validator can reason about it. `ServeSpec.from_vars(vars)` reads the
variables (with or without the `vllm_service_` prefix) and raises FleetInputError naming the variable, the
value and the fix. `None` means "leave vLLM's default" (or, for TP / port / custom all-reduce, "take it from
the layout").
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from vllm_fleet import flags as flagcat
from vllm_fleet import hostvalues
from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import parse_human_int, parse_size

PREFIX = "vllm_service_"

# The schema's variable -> flag table: every vLLM flag vllm-fleet renders itself, under the variable (or
# layout field) that sets it. `vllm_service_extra_args` may not carry any of them, in any spelling vLLM's
# parser accepts (aliases such as -tp, --no-* negations, `--flag=value`, underscores, unambiguous prefixes):
# two values for one setting would leave the last word to win silently. tests/unit/test_bad_input_matrix.py
# checks that every flag the renderer emits is in this table.
VARIABLE_FLAGS: dict[str, tuple[str, ...]] = {
    "model": ("--model",),
    "served_model_name": ("--served-model-name",),
    "tensor_parallel_size": ("--tensor-parallel-size",),
    "max_model_len": ("--max-model-len",),
    "dtype": ("--dtype",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "kv_cache_memory_bytes": ("--kv-cache-memory-bytes",),
    "gpu_memory_utilization": ("--gpu-memory-utilization",),
    "enable_prefix_caching": ("--enable-prefix-caching",),
    "enable_chunked_prefill": ("--enable-chunked-prefill",),
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
    "max_num_seqs": ("--max-num-seqs",),
    "scheduler_reserve_full_isl": ("--scheduler-reserve-full-isl",),
    "kv_offload_cpu_bytes": ("--kv-transfer-config",),
    "speculative_config": ("--speculative-config",),
    "rope_scaling": ("--rope-scaling",),
    "hf_overrides": ("--hf-overrides",),
    "limit_mm_per_prompt": ("--limit-mm-per-prompt",),
    "mm_processor_kwargs": ("--mm-processor-kwargs",),
    "mm_ipc_gpu_memory_gb": ("--mm-ipc-gpu-memory-gb",),
    "compilation_config": ("--compilation-config",),
    "enforce_eager": ("--enforce-eager",),
    "disable_custom_all_reduce": ("--disable-custom-all-reduce",),
    "reasoning_parser": ("--reasoning-parser",),
    "tool_call_parser": ("--tool-call-parser",),
    "enable_auto_tool_choice": ("--enable-auto-tool-choice",),
    "enable_prompt_tokens_details": ("--enable-prompt-tokens-details",),
    "host": ("--host",),
    "port": ("--port",),
    "shutdown_timeout": ("--shutdown-timeout",),
    # an instance over several hosts (plan.nodes): rank, master and headless come from the node plan
    "nodes": ("--nnodes", "--node-rank", "--master-addr", "--headless"),
    "master_port": ("--master-port",),
    # never in argv at all: /proc/<pid>/cmdline, `systemctl status` and the 0644 unit would show it
    "api_key": ("--api-key",),
    # the layout's NUMA binding (gpu_topology.layout), not a variable
    "gpu_topology.layout numa_binding": ("--numa-bind", "--numa-bind-nodes"),
}
# Secret flags without a variable of their own: their value belongs in the 0600 EnvironmentFile.
SECRET_FLAGS = {"--hf-token": "vllm_service_secret_env: {HF_TOKEN: ...} (from Ansible Vault)"}
# Environment the layout sets per instance (gpu_topology.layout instances' env, CUDA_VISIBLE_DEVICES) and the
# API key's variable: vllm_service_extra_env / secret_env may not set them (the instance's own value would be
# replaced without a word).
LAYOUT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE")
OWNED_ENV = {
    **dict.fromkeys(LAYOUT_ENV, "the layout (gpu_topology.layout; re-run the probe, or pick GPUs there)"),
    "VLLM_API_KEY": "vllm_service_api_key (written only to the 0600 EnvironmentFile)",
}

# How long a stopping instance lets its requests in flight finish (seconds): a long request on the seed's
# deployment (a 128k-token prompt's prefill, then thousands of output tokens at 20-50 tokens/s under load)
# runs for minutes. vLLM exits as soon as nothing is in flight, so an idle instance does not wait for it.
DEFAULT_SHUTDOWN_TIMEOUT = 600

# Names of environment variables that carry a credential (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY...):
# vllm_service_extra_env is written in clear into reports/plan/<host>.json and `plan --json`; such a value
# belongs in vllm_service_secret_env (the 0600 EnvironmentFile only).
SECRET_ENV_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY")
SECRET_ENV_PAIRS = ("API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "AUTH_KEY")


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential."""
    upper = name.upper()
    return any(word in SECRET_ENV_WORDS for word in upper.split("_")) or any(
        pair in upper for pair in SECRET_ENV_PAIRS
    )


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
    # SIGTERM drains in-flight requests for up to this long (--shutdown-timeout, vLLM >= 0.18; 0: vLLM's
    # abort, its own default).
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT
    host: str | None = None
    port: int | None = None
    api_key: str | None = field(default=None, repr=False)
    allow_unauthenticated: bool = False
    avg_input_len: int | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
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
        model = reader.model()
        spec = cls(
            model=model,
            served_model_name=reader.names("served_model_name"),
            tensor_parallel_size=reader.int_("tensor_parallel_size", minimum=1),
            max_model_len=reader.human_int("max_model_len", minimum=1),
            dtype=reader.word("dtype"),
            kv_cache_dtype=reader.word("kv_cache_dtype"),
            kv_cache_memory_bytes=reader.size("kv_cache_memory_bytes"),
            gpu_memory_utilization=reader.float_("gpu_memory_utilization", low=0.0, high=1.0),
            enable_prefix_caching=reader.bool_("enable_prefix_caching"),
            enable_chunked_prefill=reader.bool_("enable_chunked_prefill"),
            max_num_batched_tokens=reader.human_int("max_num_batched_tokens", minimum=1),
            max_num_seqs=reader.int_("max_num_seqs", minimum=1),
            scheduler_reserve_full_isl=reader.bool_("scheduler_reserve_full_isl"),
            kv_offload_cpu_bytes=reader.size("kv_offload_cpu_bytes"),
            kv_offload_eviction_policy=reader.word("kv_offload_eviction_policy"),
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
            reasoning_parser=reader.word("reasoning_parser"),
            tool_call_parser=reader.word("tool_call_parser"),
            enable_auto_tool_choice=bool(reader.bool_("enable_auto_tool_choice")),
            enable_prompt_tokens_details=bool(reader.bool_("enable_prompt_tokens_details")),
            host=reader.host(),
            port=reader.int_("port", minimum=1, maximum=65535),
            shutdown_timeout=_or(reader.int_("shutdown_timeout", minimum=0), DEFAULT_SHUTDOWN_TIMEOUT),
            api_key=reader.secret("api_key"),
            allow_unauthenticated=bool(reader.bool_("allow_unauthenticated")),
            avg_input_len=reader.human_int("avg_input_len", minimum=1),
            extra_args=reader.args("extra_args"),
            extra_env=reader.env("extra_env", secret=False),
            secret_env=reader.env("secret_env", secret=True),
            venv=reader.path("venv") or cls.venv,
            numactl_path=reader.path("numactl_path") or cls.numactl_path,
        )
        _check_offload_keys(spec)
        _check_exposure(spec)
        check_service_vars(raw)
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON, the API key masked (it must never reach a log or an instance plan)."""
        data = asdict(self)
        if data.get("api_key"):
            data["api_key"] = hostvalues.MASK
        data["secret_env"] = dict.fromkeys(self.secret_env, hostvalues.MASK)
        return data

    @property
    def num_speculative_tokens(self) -> int:
        value = self.speculative_config.get("num_speculative_tokens", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


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


def _check_exposure(spec: ServeSpec) -> None:
    """An API that listens beyond loopback without a key serves anyone who reaches the port: refused unless
    the inventory says so in as many words."""
    if spec.api_key or spec.allow_unauthenticated or hostvalues.is_loopback(spec.host):
        return
    raise FleetInputError(
        f"vllm_service_host: {spec.host or '(unset: every interface)'!r} listens beyond this machine, but "
        "vllm_service_api_key is not set, so anyone who reaches the port may use the API; set "
        "vllm_service_api_key (from Ansible Vault; vLLM then answers 401 without it), or bind to 127.0.0.1, "
        "or set vllm_service_allow_unauthenticated: true to serve an open API on purpose"
    )


@functools.lru_cache(maxsize=1)
def _option_owners() -> dict[str, tuple[str, str]]:
    """Every spelling of every rendered flag in any catalogued release (the flag, its aliases and negations)
    -> (the flag, the variable that sets it)."""
    owners: dict[str, tuple[str, str]] = {}
    owned = {flag: var for var, flags in VARIABLE_FLAGS.items() for flag in flags}
    owned.update(SECRET_FLAGS)
    for data in flagcat.flag_entries():
        option = data["option"]
        if option in owned:
            for spelling in (option, *data["aliases"], *data["negations"]):
                owners[spelling] = (option, owned[option])
    for option, variable in owned.items():
        owners.setdefault(option, (option, variable))
    return owners


def _variable_shown(variable: str) -> str:
    return variable if " " in variable or ":" in variable else PREFIX + variable


def owned_option(word: str) -> tuple[str, str] | None:
    """(flag, variable) when an extra_args word is one of the flags the schema renders itself, in any spelling
    vLLM's parser takes (`--port=1`, `--max_model_len`, `-tp`, `--no-enable-prefix-caching`, `--api-k`)."""
    if not word.startswith("-"):
        return None
    name = flagcat.normalise_option(word).split(".", 1)[0]
    owners = _option_owners()
    if name in owners:
        return owners[name]
    if not name.startswith("--"):
        # a short alias with its value attached: -O3 is -O 3, -tp2 is -tp 2
        attached = {owners[o] for o in owners if not o.startswith("--") and name.startswith(o)}
        return next(iter(attached)) if len(attached) == 1 else None
    if name in flagcat.options_in_any_release():
        return None
    # argparse's allow_abbrev: a prefix of exactly one flag is that flag
    prefixed = {owners[o] for o in owners if o.startswith(name) and o.startswith("--")}
    return next(iter(prefixed)) if len(prefixed) == 1 else None


def check_extra_args(words: tuple[str, ...]) -> None:
    for word in words:
        owner = owned_option(word)
        if owner is None:
            continue
        flag, variable = owner
        spelled = word.split("=", 1)[0]  # never the value: it may be a secret
        if flag in SECRET_FLAGS or flag == "--api-key":
            raise FleetInputError(
                f"vllm_service_extra_args: {spelled} would put a secret in argv, where /proc/<pid>/cmdline, "
                "`systemctl status` and the 0644 unit show it; remove it and set "
                f"{_variable_shown(variable)} instead (it reaches vLLM through the 0600 EnvironmentFile only)"
            )
        raise FleetInputError(
            f"vllm_service_extra_args: {spelled} is {flag}, which vllm-fleet renders itself from "
            f"{_variable_shown(variable)}; remove it from vllm_service_extra_args and set "
            f"{_variable_shown(variable)} instead"
        )


# Variables of the unit (not of the serve command) that reach the host: checked here too, so preflight refuses
# them before any host changes (vllm_fleet.deploy.service checks them again where it writes the files).
SERVICE_PATHS = ("config_dir", "unit_dir", "cache_dir", "python")
SERVICE_NAMES = ("user", "group")
SERVICE_INTS = ("start_timeout", "restart_sec", "start_limit_burst", "start_limit_interval", "limit_nofile")


def check_service_vars(raw: dict[str, Any]) -> None:
    """The vllm_service_* variables of the unit itself: paths, names, the unit prefix, writable paths."""
    reader = _Reader(raw)
    for name in SERVICE_PATHS:
        value = reader._get(name)
        if value is not None:
            example = _PATH_EXAMPLES.get(name, "/opt/x")
            hostvalues.absolute_path(value, PREFIX + name, example=example, spaces=False)
    for name in SERVICE_NAMES:
        value = reader._get(name)
        if value is not None:
            hostvalues.user_name(value, PREFIX + name)
    prefix = reader._get("unit_prefix")
    if prefix is not None:
        hostvalues.matching(
            prefix,
            PREFIX + "unit_prefix",
            hostvalues.UNIT_PREFIX,
            "a unit name prefix (letters, digits, ':', '_', '.', '-'; no '/' or '@')",
            example="vllm-fleet-",
        )
    paths = reader._get("read_write_paths")
    if paths is not None:
        if not isinstance(paths, list):
            raise reader._fail("read_write_paths", paths, "a list of absolute paths, e.g. [/data/models]")
        for i, path in enumerate(paths):
            hostvalues.absolute_path(path, f"{PREFIX}read_write_paths[{i}]", example="/data/models")
    for name in SERVICE_INTS:
        reader.int_(name, minimum=1)


_PATH_EXAMPLES = {
    "venv": "/opt/vllm-fleet/venv",
    "numactl_path": "/usr/bin/numactl",
    "config_dir": "/etc/vllm-fleet",
    "unit_dir": "/etc/systemd/system",
    "cache_dir": "/var/cache/vllm-fleet",
    "python": "/usr/bin/python3",
}


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

    def model(self) -> str:
        value = self.str_("model")
        if not value:
            raise FleetInputError(
                "vllm_service_model: not set; give the model directory on the host (or a Hugging Face id), "
                "e.g. vllm_service_model: /data/vllm_models/Qwen3-27B"
            )
        if value.startswith("/"):
            return hostvalues.absolute_path(value, PREFIX + "model", example="/data/vllm_models/Qwen3-27B")
        if ".." in value or not hostvalues.HF_ID.fullmatch(value):
            raise self._fail(
                "model",
                value,
                "an absolute model directory or a Hugging Face id (org/name of letters, digits, '-', '_', "
                "'.'); give e.g. /data/vllm_models/Qwen3-27B or Qwen/Qwen3-8B",
            )
        return value

    def word(self, name: str) -> str | None:
        """A plain setting word (dtype, parser, policy): an argv word, so never a flag or a line."""
        value = self.str_(name)
        if value is None:
            return None
        return hostvalues.matching(
            value,
            PREFIX + name,
            hostvalues.WORD,
            "a plain word (letters, digits, '_', '.', '+', '-', not starting with '-')",
            example="bfloat16",
        )

    def host(self) -> str | None:
        value = self.str_("host")
        return None if value is None else hostvalues.listen_host(value, PREFIX + "host")

    def path(self, name: str) -> str | None:
        value = self._get(name)
        if value is None:
            return None
        return hostvalues.absolute_path(value, PREFIX + name, example=_PATH_EXAMPLES.get(name, "/opt/x"))

    def secret(self, name: str) -> str | None:
        """A secret string: any error shows the mask, never the value (whatever its type)."""
        value = self._get(name)
        if value is None:
            return None
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise FleetInputError(
                f"{PREFIX}{name}: {hostvalues.MASK} (a {type(value).__name__}) is not a string; give the key "
                "as one string, e.g. from Ansible Vault"
            )
        text = hostvalues.no_control(value, PREFIX + name, secret=True, fix="give the key as one line")
        if text != text.strip() or not text:
            raise FleetInputError(
                f"{PREFIX}{name}: {hostvalues.MASK} starts or ends with whitespace; give the key without it"
            )
        return text

    def env(self, name: str, *, secret: bool) -> dict[str, str]:
        value = self._get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            shown = hostvalues.shown(value, secret=secret)
            raise FleetInputError(f"{PREFIX}{name}: {shown} is not a mapping; give NAME: value pairs")
        out: dict[str, str] = {}
        for key, item in value.items():
            variable = f"{PREFIX}{name}.{key}"
            hostvalues.env_name(key, f"{PREFIX}{name}")
            if key in OWNED_ENV:
                raise FleetInputError(
                    f"{PREFIX}{name}: {key} is set by {OWNED_ENV[key]}; remove it from {PREFIX}{name} and "
                    "set it there instead"
                )
            if not secret and looks_secret(key):
                raise FleetInputError(
                    f"{PREFIX}{name}: {key}={hostvalues.MASK} looks like a credential, and this variable is "
                    "written in clear into reports/plan/<host>.json and `vllm-fleet plan --json`; move it to "
                    f"{PREFIX}secret_env (from Ansible Vault), which reaches only the 0600 EnvironmentFile"
                )
            if item is None:
                continue
            if isinstance(item, (dict, list)):
                raise FleetInputError(
                    f"{variable}: {hostvalues.shown(item, secret=secret)} is not a plain value; give a string"
                )
            text = str(item).lower() if isinstance(item, bool) else str(item)
            out[key] = hostvalues.no_control(text, variable, secret=secret, fix="give the value on one line")
        return out

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
            if not math.isfinite(number):  # nan passes every comparison below
                raise ValueError
        except (TypeError, ValueError):
            raise self._fail(name, value, "a finite number") from None
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
            value = [value]
        if value == []:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self._fail(name, value, "a name or a list of names")
        for i, item in enumerate(value):
            hostvalues.no_control(item, f"{PREFIX}{name}[{i}]", fix="give the name on one line")
            if item.startswith("-"):
                raise self._fail(f"{name}[{i}]", item, "a name; a leading '-' would make it a flag")
        return tuple(value)

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
        words = tuple(str(v) for v in value)
        for i, word in enumerate(words):
            # the words may hold a secret by mistake: the message shows none of them
            hostvalues.no_control(
                word, f"{PREFIX}{name}[{i}]", secret=True, fix="give each argv word on one line"
            )
        check_extra_args(words)
        return words

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
        root = hostvalues.absolute_path(value["root_dir"], f"{PREFIX}{name}.root_dir", example="/nvme/kv")
        return FsTier(root_dir=root, extra=extra, **threads)


def variable_names() -> list[str]:
    """Every public variable of the schema, prefixed (defaults/main.yml and argument_specs must list them)."""
    return [PREFIX + f.name for f in fields(ServeSpec)]
