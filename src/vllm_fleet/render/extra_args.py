"""The serve flags in `vllm_service_extra_args` that change the capacity plan, read the way vLLM reads them.

Flags vllm-fleet renders itself (`--enable-prefix-caching` / `--no-enable-prefix-caching`, `--kv-cache-dtype`,
`--max-model-len`, ... : `schema.VARIABLE_FLAGS`) are refused in extra_args by `schema.check_extra_args`,
because they have a typed variable. The flags below have none, and a user sets them in extra_args the way
vLLM's documentation spells them; the plan then has to read them, or its figures (the KV tokens verify checks
in the startup log) would be those of vLLM's defaults, not of the argv vLLM gets. One parser, argparse's
spellings (`--flag=value`, `--flag value`, `--flag_name`, aliases such as `-dcp`, an unambiguous prefix of
exactly one flag), the last occurrence winning as in argparse:

- `--block-size`, `--decode-context-parallel-size` / `-dcp`, `--mamba-cache-mode`: passed to the planner
  (a DCP size must divide the instance's TP, as vLLM requires);
- `--pipeline-parallel-size` / `-pp`, `--data-parallel-size` / `-dp`: above 1 the instance needs
  TP x PP x DP GPUs while the layout gives it its TP GPUs only (CUDA_VISIBLE_DEVICES), so vLLM would stop at
  start-up: preflight refuses it (a size of 1 is harmless and read);
- `--num-gpu-blocks-override`: vLLM then allocates that many blocks whatever the KV memory, so the plan is
  not made (said in a warning) rather than made wrong;
- `--disable-hybrid-kv-cache-manager` / `--no-disable-hybrid-kv-cache-manager`: passed to the planner (off,
  vLLM sizes sliding-window and chunked-local layers beside full attention as full attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_fleet import flags as flagcat
from vllm_fleet.errors import FleetInputError

VARIABLE = "vllm_service_extra_args"
_INT_DESTS = (
    "block_size",
    "pipeline_parallel_size",
    "decode_context_parallel_size",
    "data_parallel_size",
    "num_gpu_blocks_override",
)
_TEXT_DESTS = ("mamba_cache_mode",)
# switches without a value (`--x` / `--no-x`): whether vLLM keeps the hybrid KV-cache manager
_BOOL_DESTS = ("disable_hybrid_kv_cache_manager",)
PLAN_DESTS = _INT_DESTS + _TEXT_DESTS + _BOOL_DESTS
# every mode the planner knows; a release's catalogued choices narrow it (0.33.0 lists align and none)
_MAMBA_CACHE_MODES = ("none", "align", "all")


@dataclass(frozen=True)
class PlanFlags:
    """The values extra_args gives the plan (None: not given, vLLM's default applies)."""

    block_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    data_parallel_size: int | None = None
    num_gpu_blocks_override: int | None = None
    mamba_cache_mode: str | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    spelled: dict[str, str] = field(default_factory=dict)  # dest -> "word value" as the user wrote it
    # no flag: vllm_service_pp_layer_partition (VLLM_PP_LAYER_PARTITION) of an instance over several hosts
    pp_layer_partition: tuple[int, ...] | None = None

    def capacity_args(self) -> dict[str, int | str | bool]:
        """The keyword arguments of `plan.capacity.plan_capacity` that extra_args set (the others keep
        plan_capacity's defaults, which are vLLM's)."""
        given = {
            "block_size": self.block_size,
            "mamba_cache_mode": self.mamba_cache_mode,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "decode_context_parallel_size": self.decode_context_parallel_size,
            "disable_hybrid_kv_cache_manager": self.disable_hybrid_kv_cache_manager,
            "pp_layer_partition": list(self.pp_layer_partition) if self.pp_layer_partition else None,
        }
        return {name: value for name, value in given.items() if value is not None}


def looks_like_option(word: str) -> bool:
    """argparse's test: a word starting with `-` is an option unless it reads as a negative number."""
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _resolve(word: str, release: flagcat.Release) -> flagcat.FlagInfo | None:
    """The flag an option word names in this release: itself, an alias, a negation or a unique prefix."""
    name = flagcat.normalise_option(word).split(".", 1)[0]
    info = release.lookup(name)
    if info is None:
        longer = release.abbreviation_of(name)
        if len(longer) == 1:
            info = release.lookup(longer[0])
    return info


def _int_value(spelled: str, text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise FleetInputError(
            f"{VARIABLE}: {spelled} {text!r} is not a whole number >= 1; {option} takes one, "
            f"e.g. ['{option}', '2']"
        )
    return value


def plan_flags(words: Sequence[str], release: flagcat.Release) -> PlanFlags:
    """The plan's flags among argv words (no program name); a bad value raises FleetInputError naming
    vllm_service_extra_args, the word, the value and the fix. Words of other flags are left to
    `validate.check_args`, which checks every flag against the release's catalog."""
    found: dict[str, int | str | bool] = {}
    spelled: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not looks_like_option(word):
            continue
        info = _resolve(word, release)
        if info is None:
            continue
        attached = "=" in word
        if info.dest not in PLAN_DESTS:
            if info.takes_value and not attached and i < len(words) and not looks_like_option(words[i]):
                i += 1  # its value, which may look like anything but an option
            continue
        shown = word.split("=", 1)[0]
        if info.dest in _BOOL_DESTS:
            found[info.dest] = not info.negated
            spelled[info.dest] = shown
            continue
        if attached:
            text = word.split("=", 1)[1]
        elif i < len(words) and not looks_like_option(words[i]):
            text = words[i]
            i += 1
        else:
            raise FleetInputError(
                f"{VARIABLE}: {shown} needs a value (give it as the next list item, e.g. "
                f"['{info.option}', '2'])"
            )
        if info.dest in _INT_DESTS:
            found[info.dest] = _int_value(shown, text, info.option)
        else:
            modes = info.choices or _MAMBA_CACHE_MODES
            if text not in modes:
                raise FleetInputError(
                    f"{VARIABLE}: {shown} {text!r} is not a mode vLLM {release.version} takes; "
                    f"use one of {', '.join(modes)}"
                )
            found[info.dest] = text
        spelled[info.dest] = f"{shown} {text}"
    return PlanFlags(**found, spelled=spelled)  # type: ignore[arg-type]


def parallel_errors(flags: PlanFlags, instance: str, tp: int) -> list[str]:
    """Pipeline / data parallelism in extra_args (the layout gives the instance only its TP GPUs), and a
    decode context parallel size that does not divide TP (DCP reuses the TP group's GPUs: vLLM's
    ParallelConfig requires tensor_parallel_size % decode_context_parallel_size == 0)."""
    errors = []
    dcp = flags.decode_context_parallel_size
    if dcp is not None and tp % dcp:
        errors.append(
            f"{VARIABLE}: {flags.spelled['decode_context_parallel_size']} does not divide instance "
            f"{instance}'s tensor_parallel_size {tp} (decode context parallelism splits the TP group, and "
            f"vLLM refuses a size that does not divide it); use a divisor of {tp}, or remove it"
        )
    for dest, what in (("pipeline_parallel_size", "pipeline"), ("data_parallel_size", "data")):
        size = getattr(flags, dest)
        if size is not None and size > 1:
            errors.append(
                f"{VARIABLE}: {flags.spelled[dest]} asks instance {instance} for {what} parallelism, "
                f"i.e. {tp} x {size} GPUs, but the layout gives it its {tp} (tensor_parallel_size, "
                "CUDA_VISIBLE_DEVICES) and vLLM would stop at start-up; remove it from "
                f"{VARIABLE} (on one host vllm-fleet lays out tensor-parallel instances only; pipeline "
                "stages over several hosts: vllm_service_nodes and vllm_service_pipeline_parallel_size)"
            )
    return errors
