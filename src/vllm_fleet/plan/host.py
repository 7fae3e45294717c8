"""The plan of one host: what every later stage reads, built once (`vllm_fleet.plan.build.build_host_plan`).

    HostPlan      the host: its instances, what they need from the host, where the facts came from
    InstancePlan  one `vllm serve` process: layout (GPUs, NUMA binding, env), argv, capacity, expectations

`InstancePlan.to_dict()` is the document deploy writes to `/etc/vllm-fleet/<instance>.json` and the instance
entry of `vllm-fleet plan --json` / `reports/plan/<host>.json`; verify and rollout read it back with
`InstancePlan.from_dict`. Nothing is parsed back out of the argv: the plan says where the API listens, what it
serves and what vLLM's startup lines must show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, get_type_hints

from vllm_fleet.errors import FleetInputError
from vllm_fleet.jsonfile import check_shape

SCHEMA_VERSION = 1
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::", "[::]")


def plain(value: Any) -> Any:
    """JSON-shaped data as plain dicts and lists: plans reach filters as Ansible's lazy containers, which
    `dataclasses.asdict` cannot rebuild (it calls their type)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def connect_address(listen: str | None) -> str:
    """Where a client on the host itself reaches an API listening on `listen` (wildcards: loopback)."""
    return "127.0.0.1" if (listen or "") in WILDCARD_ADDRESSES else str(listen)


@dataclass(frozen=True)
class InstanceNeeds:
    """What one instance needs from its host beyond its GPUs; host_tuning sizes the host for the sum."""

    cpu_kv_bytes: int = 0  # the CPU KV tier (vLLM >= 0.20 maps it in /dev/shm)
    shm_bytes: int = 0  # of /dev/shm: the CPU KV tier where the release maps it there, else 0
    numa_nodes: tuple[
        int, ...
    ] = ()  # the nodes its memory is bound to (memory for the tier comes from there)
    port: int | None = None


@dataclass
class InstancePlan:
    name: str
    host: str
    unit: str
    vllm_version: str  # the release's public part (0.32.0, never 0.32.0+cpu)
    catalog_release: str  # the flag catalog's release the argv was checked against
    model: str
    served_model_name: str
    max_model_len: int | None
    address: str  # the address vLLM listens on (--host), "" for its default
    port: int
    device: str  # "cuda" | "cpu"
    gpus: list[int]
    tensor_parallel_size: int
    numa_binding: dict[str, Any]
    argv: list[str]
    exec_start: str
    shell: str
    env: dict[str, str]  # what the EnvironmentFile holds besides the secrets
    secret_env_names: list[str]
    prefix_caching: bool
    spec_decode: bool
    capacity: dict[str, Any] | None  # vllm_fleet.plan.capacity.CapacityPlan.to_dict(), None when not planned
    expectations: dict[str, Any]  # what verify checks in vLLM's startup lines (vllm_fleet.verify.logcheck)
    needs: InstanceNeeds
    layout: dict[str, Any]  # the layout instance (reasons, warnings, CUDA_VISIBLE_DEVICES, ...)
    warnings: list[str] = field(default_factory=list)
    # this host's part of an instance over several hosts (vllm_fleet.plan.nodes.NodePlan.to_dict()): its
    # rank, the master, the TP x PP split; None, and absent from to_dict(), for an instance of one host
    node: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def headless(self) -> bool:
        """A rank > 0 of a multi-host instance: workers only, no API (no gateway server, no scrape)."""
        return bool((self.node or {}).get("headless"))

    @property
    def base_url(self) -> str:
        address = connect_address(self.address)
        return f"http://[{address}]:{self.port}" if ":" in address else f"http://{address}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["instance"] = data.pop("name")
        data["needs"]["numa_nodes"] = list(self.needs.numa_nodes)
        data["base_url"] = self.base_url
        if self.node is None:
            del data["node"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "instance plan") -> InstancePlan:
        """From `to_dict()` output (a deploy's `/etc/vllm-fleet/<instance>.json` or a `plan --json` entry)."""
        if not isinstance(data, Mapping):
            raise FleetInputError(
                f"{where}: expected a JSON object (an instance plan), got {type(data).__name__}"
            )
        data = plain(data)
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise FleetInputError(
                f"{where}: schema_version {version!r}, this vllm-fleet reads {SCHEMA_VERSION}; "
                "it was written by another vllm-fleet release (or is not an instance plan): "
                "run preflight and deploy again"
            )
        values = {k: v for k, v in data.items() if k not in ("instance", "base_url", "needs")}
        values["name"] = data.get("instance")
        fix = "run preflight and deploy again"
        check_shape(values, get_type_hints(cls), where, fix)
        needs = data.get("needs") or {}
        check_shape({"needs": needs}, {"needs": dict[str, Any]}, where, fix)
        check_shape(needs, get_type_hints(InstanceNeeds), f"{where} needs", fix)
        needs = dict(needs)
        needs["numa_nodes"] = tuple(needs.get("numa_nodes") or ())
        try:
            values["needs"] = InstanceNeeds(**needs)
            known = {f.name for f in fields(cls)}
            optional = ("warnings", "node", "schema_version")
            missing = sorted(n for n in known if n not in values and n not in optional)
            if missing:
                raise TypeError(f"missing {', '.join(missing)}")
            return cls(**{k: v for k, v in values.items() if k in known})
        except TypeError as exc:
            raise FleetInputError(
                f"{where}: not an instance plan of schema {SCHEMA_VERSION} ({exc})"
            ) from exc


@dataclass(frozen=True)
class HostNeeds:
    """The sums host_tuning provides for: every instance's CPU KV tier and /dev/shm share, bound nodes."""

    cpu_kv_bytes: int
    shm_bytes: int
    cpu_kv_bytes_by_instance: dict[str, int]
    bound_numa_nodes: tuple[int, ...]  # nodes some instance is bound to (kernel.numa_balancing off there)


@dataclass
class HostPlan:
    host: str
    vllm_version: str
    source: str  # where the facts came from: "probed live" | "recorded: <dir>"
    cpu_only: bool
    model_config_source: str  # where the model's config.json was read, or why it was not
    instances: list[InstancePlan]
    needs: HostNeeds
    layout: dict[str, Any]  # the layout's host-level part: tensor_parallel_size, idle GPUs, reasons, warnings
    report: str = ""  # the readable report: GPUs, links, NUMA, P2P and the layout with its reasons
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["instances"] = [i.to_dict() for i in self.instances]
        data["needs"]["bound_numa_nodes"] = list(self.needs.bound_numa_nodes)
        data["ok"] = self.ok
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "host plan") -> HostPlan:
        if isinstance(data, Mapping):
            data = plain(data)
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise FleetInputError(
                f"{where}: not a host plan of schema {SCHEMA_VERSION}; run playbooks/preflight.yml (or "
                "vllm-fleet plan --inventory) again"
            )
        fix = "run playbooks/preflight.yml (or vllm-fleet plan --inventory) again"
        hints = get_type_hints(cls)
        hints["instances"] = list[dict[str, Any]]
        del hints["needs"]
        check_shape(data, hints, where, fix)
        needs = data.get("needs") or {}
        check_shape({"needs": needs}, {"needs": dict[str, Any]}, where, fix)
        check_shape(needs, get_type_hints(HostNeeds), f"{where} needs", fix)
        names = [f.name for f in fields(HostNeeds)]
        if sorted(needs) != sorted(names):
            raise FleetInputError(f"{where} needs: keys {sorted(needs)}, expected {names}; {fix}")
        missing = [key for key in ("host", "vllm_version") if key not in data]
        if missing:
            raise FleetInputError(f"{where}: no {', '.join(missing)}; {fix}")
        needs = dict(needs)
        needs["bound_numa_nodes"] = tuple(needs.get("bound_numa_nodes") or ())
        return cls(
            host=str(data["host"]),
            vllm_version=str(data["vllm_version"]),
            source=str(data.get("source") or ""),
            cpu_only=bool(data.get("cpu_only")),
            model_config_source=str(data.get("model_config_source") or ""),
            instances=[
                InstancePlan.from_dict(i, where=f"{where} instance {n}")
                for n, i in enumerate(data.get("instances") or [])
            ],
            needs=HostNeeds(**needs),
            layout=dict(data.get("layout") or {}),
            report=str(data.get("report") or ""),
            errors=list(data.get("errors") or []),
            warnings=list(data.get("warnings") or []),
        )
