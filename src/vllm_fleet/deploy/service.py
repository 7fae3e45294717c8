"""What the vllm_service role writes for each instance: the systemd unit, the EnvironmentFile, the instance
plan, and which instances must (re)start or go away. Pure functions over the host's plan
(`vllm_fleet.plan.host.InstancePlan`, built by preflight), which is written as it is.

One unit per instance (`vllm-fleet-<instance>.service`), not a template unit: the instances differ in more
than their name (GPUs, NUMA wrapper, port, sometimes flags), so every unit holds its whole command and a
change to one instance never touches another.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import FleetInputError
from vllm_fleet.flags import public_version
from vllm_fleet.plan.host import InstancePlan
from vllm_fleet.render.serve import systemd_quote_word

MARKER_KEY = "X-VllmFleet-Instance"  # systemd ignores X- keys; it names the instance a unit belongs to
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INSTANCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# vLLM polls nothing itself: ExecStartPost waits here until /health answers, so systemd's start timeout is the
# model-load deadline and `systemctl is-active` means "serving". It gives up as soon as the main process is
# gone (systemd passes MAINPID to ExecStartPost): a crash while loading then fails the start at once instead
# of leaving the unit "activating" until the start timeout.
WAIT_READY = (
    "import os, sys, time, urllib.request\n"
    "pid = int(os.environ.get('MAINPID') or 0)\n"
    "while True:\n"
    "    try:\n"
    "        urllib.request.urlopen(sys.argv[1], timeout=5)\n"
    "        break\n"
    "    except Exception:\n"
    "        pass\n"
    "    try:\n"
    "        pid and os.kill(pid, 0)\n"
    "    except ProcessLookupError:\n"
    "        sys.exit('vLLM exited before ' + sys.argv[1] + ' answered')\n"
    "    except PermissionError:\n"
    "        pass\n"
    "    time.sleep(2)\n"
)


@dataclass(frozen=True)
class ServiceOptions:
    user: str = "vllm"
    group: str = "vllm"
    config_dir: str = "/etc/vllm-fleet"
    unit_dir: str = "/etc/systemd/system"
    unit_prefix: str = "vllm-fleet-"
    cache_dir: str = "/var/cache/vllm-fleet"
    state_dir: str = "/var/lib/vllm-fleet/applied"
    read_write_paths: tuple[str, ...] = ()
    start_timeout: int = 1800
    restart_sec: int = 15
    start_limit_burst: int = 3
    start_limit_interval: int = 3600
    limit_nofile: int = 1048576
    python: str = "/usr/bin/python3"
    after: tuple[str, ...] = ("network-online.target", "vllm-fleet-tuning.service")


@dataclass
class InstanceFiles:
    name: str
    unit_name: str
    unit_path: str
    unit_text: str
    env_path: str
    env_text: str
    plan_path: str
    plan: dict[str, Any]
    plan_text: str
    digest: str
    digest_path: str
    health_url: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_instance_name(name: str) -> str:
    if not _INSTANCE_NAME.fullmatch(name or ""):
        raise FleetInputError(
            f"layout instance name {name!r}: must be letters, digits, '.', '_' or '-' (it names the unit "
            "and its files); re-run the probe"
        )
    return name


def env_file_text(env: Mapping[str, Any], *, what: str = "vllm_service_extra_env") -> str:
    """A systemd EnvironmentFile: one KEY="value" per line, values double-quoted with `\\` and `"` escaped
    (systemd unquotes them; no `$` expansion happens in these files)."""
    lines = ["# Written by vllm-fleet (vllm_service). Mode 0600: it may hold secrets."]
    for key in sorted(env):
        if not _ENV_NAME.fullmatch(str(key)):
            raise FleetInputError(
                f"{what}: {key!r} is not an environment variable name; use letters, digits and '_', "
                "not starting with a digit"
            )
        value = env[key]
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if "\n" in text:
            raise FleetInputError(
                f"{what}: the value of {key} spans lines; an EnvironmentFile cannot hold it"
            )
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def exec_start_lines(argv: list[str]) -> str:
    """ExecStart= with one line per flag (and its values), joined by `\\` continuations: `--diff` then shows
    exactly which flag of the serve command changed."""
    if not argv or not str(argv[0]).startswith("/"):
        raise FleetInputError(
            f"ExecStart: the first word must be an absolute path, got {argv[:1]!r}; set vllm_service_venv "
            "to the venv's absolute path"
        )
    words = list(argv)
    groups: list[list[str]] = []
    if words[0].rsplit("/", 1)[-1] == "numactl":
        wrapper = [words.pop(0)]
        while words and words[0].startswith("-"):
            wrapper.append(words.pop(0))
        groups.append(wrapper)
    head: list[str] = []
    while words and not words[0].startswith("--"):
        head.append(words.pop(0))
    groups.append(head)  # <venv>/bin/vllm serve <model>
    for word in words:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    lines = [" ".join(systemd_quote_word(w) for w in group) for group in groups]
    return "ExecStart=" + " \\\n    ".join(lines)


def unit_text(
    name: str,
    argv: list[str],
    *,
    health_url: str,
    layout_instance: Mapping[str, Any],
    vllm_version: str,
    options: ServiceOptions,
) -> str:
    """The whole unit file of one instance."""
    env_path = f"{options.config_dir}/{name}.env"
    plan_path = f"{options.config_dir}/{name}.json"
    home = f"{options.cache_dir}/{name}"
    binding = layout_instance.get("numa_binding") or {}
    gpus = layout_instance.get("cuda_visible_devices") or "none (CPU)"
    writable = " ".join(dict.fromkeys([options.cache_dir, *options.read_write_paths]))
    wait = " ".join(systemd_quote_word(w) for w in [options.python, "-c", WAIT_READY, health_url])
    cache_env = {
        "HOME": home,
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_CONFIG_HOME": f"{home}/.config",
        "VLLM_CACHE_ROOT": f"{home}/.cache/vllm",
        "VLLM_CONFIG_ROOT": f"{home}/.config/vllm",
        "HF_HOME": f"{home}/.cache/huggingface",
        "TRITON_CACHE_DIR": f"{home}/.cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{home}/.cache/torchinductor",
    }
    lines = [
        f"# Written by vllm-fleet (vllm_service) for instance {name}: GPUs {gpus}, NUMA binding "
        f"{binding.get('mode', 'none')} {binding.get('nodes') or ''}".rstrip(),
        f"# vLLM {vllm_version}; the instance plan (argv, layout, expectations) is {plan_path}.",
        "[Unit]",
        f"Description=vLLM instance {name} (vllm-fleet)",
        f"Documentation=file:{plan_path}",
        f"After={' '.join(options.after)}",
        "Wants=network-online.target",
        # A broken configuration stops after a few tries instead of restarting forever.
        f"StartLimitIntervalSec={options.start_limit_interval}",
        f"StartLimitBurst={options.start_limit_burst}",
        f"{MARKER_KEY}={name}",
        "",
        "[Service]",
        "Type=exec",
        f"User={options.user}",
        f"Group={options.group}",
        f"WorkingDirectory={home}",
        *(f"Environment={k}={systemd_quote_word(v)}" for k, v in cache_env.items()),
        f"EnvironmentFile={env_path}",
        exec_start_lines(argv),
        # Ready means /health answers: the start timeout below covers loading the model.
        f"ExecStartPost={wait}",
        f"TimeoutStartSec={options.start_timeout}",
        "TimeoutStopSec=120",
        "Restart=on-failure",
        f"RestartSec={options.restart_sec}",
        # Pinned host buffers (the CPU KV tier) are locked memory.
        "LimitMEMLOCK=infinity",
        f"LimitNOFILE={options.limit_nofile}",
        # Hardening: vLLM writes only below its cache directory; GPUs stay reachable (no PrivateDevices).
        "ProtectSystem=strict",
        "ProtectHome=true",
        "PrivateTmp=true",
        "NoNewPrivileges=true",
        f"ReadWritePaths={writable}",
        "ProtectKernelTunables=true",
        "ProtectKernelModules=true",
        "ProtectKernelLogs=true",
        "ProtectControlGroups=true",
        "ProtectClock=true",
        "ProtectHostname=true",
        "RestrictSUIDSGID=true",
        "RestrictRealtime=true",
        "LockPersonality=true",
        "SystemCallArchitectures=native",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def instance_files(
    plan: InstancePlan,
    *,
    options: ServiceOptions,
    secret_env: Mapping[str, Any] | None = None,
) -> InstanceFiles:
    """Everything written for one instance of the host's plan: unit, EnvironmentFile, the plan itself."""
    name = check_instance_name(plan.name)
    secret = dict(secret_env or {})
    for key in plan.secret_env_names:
        if key not in secret:
            raise FleetInputError(
                f"instance {name}: the serve command expects the secret {key} in its environment, but no "
                f"value was given; set vllm_service_api_key (VLLM_API_KEY) or vllm_service_secret_env.{key}"
            )
    env_text = env_file_text({**plan.env, **secret})
    health_url = f"{plan.base_url}/health"
    text = unit_text(
        name,
        plan.argv,
        health_url=health_url,
        layout_instance=plan.layout,
        vllm_version=plan.vllm_version,
        options=options,
    )
    document = plan.to_dict()
    document["secret_env_names"] = sorted(secret)
    plan_text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    # What runs: the unit (its ExecStart is the argv) and the environment. The plan's prose (warnings,
    # reasons) may change wording between releases of vllm-fleet without restarting anything.
    digest = hashlib.sha256("\0".join([text, env_text, json.dumps(plan.argv)]).encode()).hexdigest()
    return InstanceFiles(
        name=name,
        unit_name=plan.unit,
        unit_path=f"{options.unit_dir}/{plan.unit}",
        unit_text=text,
        env_path=f"{options.config_dir}/{name}.env",
        env_text=env_text,
        plan_path=f"{options.config_dir}/{name}.json",
        plan=document,
        plan_text=plan_text,
        digest=digest,
        digest_path=f"{options.state_dir}/{name}",
        health_url=health_url,
    )


def restart_list(
    files: list[InstanceFiles], applied: Mapping[str, str], active: Mapping[str, str]
) -> list[dict[str, str]]:
    """Instances to (re)start, each with why: a changed unit/environment/argv (its digest differs from the one
    recorded at its last start), or a unit that is not running. Untouched, running instances stay."""
    todo = []
    for f in files:
        state = active.get(f.name, "")
        if applied.get(f.name, "").strip() != f.digest:
            why = "its unit, environment or serve command changed" if f.name in applied else "new instance"
            todo.append({"name": f.name, "unit": f.unit_name, "action": "restarted", "why": why})
        elif state not in ("active", "activating", "reloading"):
            todo.append(
                {
                    "name": f.name,
                    "unit": f.unit_name,
                    "action": "started",
                    "why": f"it is {state or 'not running'}",
                }
            )
    return todo


def shm_shortfall(needed_bytes: int, shm_size_bytes: int | None, vllm_version: str) -> str:
    """Why the host's CPU KV tiers (the plan's `needs.shm_bytes`: 0 where the release keeps them outside
    /dev/shm) cannot all fit in /dev/shm; '' when they fit or the host has no /dev/shm tmpfs to judge.
    Before 0.30 nothing checks the tmpfs's space: an undersized one faults (SIGBUS) instead of refusing."""
    if needed_bytes <= 0 or shm_size_bytes is None or needed_bytes <= shm_size_bytes:
        return ""
    return (
        "vllm_service_kv_offload_cpu_bytes: the instances' CPU KV tiers need "
        f"{needed_bytes / 2**30:.2f} GiB in /dev/shm, where vLLM {public_version(vllm_version)} maps them, "
        f"but /dev/shm holds {shm_size_bytes / 2**30:.2f} GiB; "
        "run playbooks/tune.yml first (host_tuning sizes /dev/shm for the tiers), or lower the tier. "
        "Nothing was changed."
    )


def stale_instances(unit_markers: Mapping[str, str], wanted: list[str]) -> list[str]:
    """Instances that have a unit on the host (path -> marker value) but are no longer in the layout."""
    return sorted({name for name in unit_markers.values() if name and name not in set(wanted)})


def parse_markers(text: str) -> dict[str, str]:
    """`grep -H '^X-VllmFleet-Instance=' <units>` output -> {unit path: instance}."""
    out = {}
    for line in text.splitlines():
        path, sep, rest = line.partition(":")
        if sep and rest.startswith(f"{MARKER_KEY}="):
            out[path] = rest.split("=", 1)[1].strip()
    return out
