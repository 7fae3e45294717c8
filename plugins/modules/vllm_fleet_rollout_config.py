#!/usr/bin/python
"""What vllm_rollout reads and keeps of a host's vLLM configuration, in one call each: the instance units,
environment files, plans and applied digests with their checksums (and the plans' text), and a copy of them
in a snapshot folder. Each was a task per kind of file and a module run per file (`find`, `slurp`, `file`,
`copy`: about 25 module runs a turn, issue 32). Nothing is decided here: the fingerprint that names a
snapshot and everything after it are the controller's (vllm_fleet.rollout)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: vllm_fleet_rollout_config
short_description: Read a host's vLLM instance configuration, or keep a copy of it, in one call
description:
  - With O(state=read), lists the instance units in O(unit_dir) (C(<unit_prefix>*.service) holding a line that
    matches O(unit_marker)), the environment files and plans in O(config_dir) (C(*.env), C(*.json)) and the
    files in O(state_dir), each with the sha1 of its content (as M(ansible.builtin.find) with C(get_checksum)
    gives it), sorted by path, and returns the text of the plans. Changes nothing.
  - With O(state=keep), copies the files of O(units), O(config) and O(state_files) into the C(units),
    C(config) and C(state) folders of O(snapshot) (each 0700 root), their modes kept, writing only what is
    missing or differs.
  - With O(state=restore), the reverse - copies each file of O(snapshot) back to its path in O(units),
    O(config) and O(state_files) where it differs, and removes the paths of O(remove).
  - Used by the P(vllm_fleet.serving.vllm_rollout#role) role (its last-known-good snapshots).
version_added: "0.1.0"
options:
  state:
    description: Read the configuration, keep a copy of the given files, or put a kept copy back.
    type: str
    choices: [read, keep, restore]
    default: read
  unit_dir:
    description: Where the instance units are (O(state=read)).
    type: path
    default: /etc/systemd/system
  unit_prefix:
    description: The instance units' name prefix (O(state=read)).
    type: str
    default: vllm-fleet-
  unit_marker:
    description: A regular expression one line of an instance unit matches (other units share the prefix).
    type: str
    default: "^X-VllmFleet-Instance="
  config_dir:
    description: Where the environment files and plans are (O(state=read)).
    type: path
    default: /etc/vllm-fleet
  state_dir:
    description: Where the applied digests are (O(state=read)).
    type: path
    default: /var/lib/vllm-fleet/applied
  snapshot:
    description: The snapshot folder to keep the files in (O(state=keep)) or to restore them from.
    type: path
  units:
    description: The unit files to keep (O(state=keep)), or to restore (O(state=restore)).
    type: list
    elements: path
    default: []
  config:
    description: The environment files and plans to keep, or to restore.
    type: list
    elements: path
    default: []
  state_files:
    description: The applied digests to keep, or to restore.
    type: list
    elements: path
    default: []
  remove:
    description: Files to remove (O(state=restore)) - those the restored configuration does not have.
    type: list
    elements: path
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Read the running configuration
  vllm_fleet.serving.vllm_fleet_rollout_config:
    state: read
  register: running

- name: Keep it
  vllm_fleet.serving.vllm_fleet_rollout_config:
    state: keep
    snapshot: /var/lib/vllm-fleet/history/cfg-0123456789abcdef
    units: "{{ running.units | map(attribute='path') }}"
    config: "{{ running.config | map(attribute='path') }}"
    state_files: "{{ running.state | map(attribute='path') }}"
"""

RETURN = r"""
units:
  description: The instance units, each C(path) and C(checksum) (sha1), sorted by path (O(state=read)).
  type: list
  elements: dict
  returned: when state is read
config:
  description: The environment files and plans, as RV(units) (O(state=read)).
  type: list
  elements: dict
  returned: when state is read
state:
  description: The applied digests, as RV(units) (O(state=read)).
  type: list
  elements: dict
  returned: when state is read
plans:
  description: The text of each plan (the C(*.json) of RV(config)), in that order (O(state=read)).
  type: list
  elements: str
  returned: when state is read
written:
  description: The folders and files written (O(state=keep), O(state=restore)); empty when all were in place.
  type: list
  elements: str
  returned: when state is keep or restore
removed:
  description: The files removed (O(state=restore)).
  type: list
  elements: str
  returned: when state is restore
"""

SNAPSHOT_FOLDERS = ("units", "config", "state")


def sha1(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def files_in(folder: str, patterns: tuple[str, ...]) -> list[str]:
    """The regular files directly in `folder` whose name matches one of `patterns`, sorted ([] when the
    folder does not exist: nothing deployed yet)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    paths = (os.path.join(folder, name) for name in names if any(fnmatch.fnmatch(name, p) for p in patterns))
    return sorted(path for path in paths if os.path.isfile(path) and not os.path.islink(path))


def has_line(path: str, marker: re.Pattern[str]) -> bool:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return any(marker.match(line) for line in handle)


def listed(paths: list[str]) -> list[dict]:
    return [{"path": path, "checksum": sha1(path)} for path in paths]


def read_config(params: dict) -> dict:
    """The configuration's files with their checksums, and the plans' text (see the module's description)."""
    marker = re.compile(params["unit_marker"])
    units = [
        p for p in files_in(params["unit_dir"], (f"{params['unit_prefix']}*.service",)) if has_line(p, marker)
    ]
    config = files_in(params["config_dir"], ("*.env", "*.json"))
    plans = []
    for path in config:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as handle:
                plans.append(handle.read())
    return {
        "units": listed(units),
        "config": listed(config),
        "state": listed(files_in(params["state_dir"], ("*",))),
        "plans": plans,
    }


def keep_config(params: dict, check_mode: bool = False) -> list[str]:
    """Creates the snapshot's folders and copies the given files into them where missing or different; the
    folders and files written."""
    written = []
    folders = [params["snapshot"], *(os.path.join(params["snapshot"], f) for f in SNAPSHOT_FOLDERS)]
    for folder in folders:  # root's alone: the environment files hold secrets
        if not os.path.isdir(folder) or (os.stat(folder).st_mode & 0o7777) != 0o700:
            written.append(folder)
            if not check_mode:
                os.makedirs(folder, exist_ok=True)
                os.chmod(folder, 0o700)
    kinds = (params["units"], params["config"], params["state_files"])
    for folder, sources in zip(folders[1:], kinds, strict=True):
        for source in sources:
            dest = os.path.join(folder, os.path.basename(source))
            if copy_where_different(source, dest, check_mode):
                written.append(dest)
    return written


def restore_config(params: dict, check_mode: bool = False) -> tuple[list[str], list[str]]:
    """Copies each kept file back to its path where it differs, and removes `remove`: (written, removed)."""
    written = []
    kinds = (params["units"], params["config"], params["state_files"])
    for folder, paths in zip(SNAPSHOT_FOLDERS, kinds, strict=True):
        for path in paths:
            kept = os.path.join(params["snapshot"], folder, os.path.basename(path))
            if copy_where_different(kept, path, check_mode):
                written.append(path)
    removed = [path for path in params["remove"] if os.path.lexists(path)]
    if not check_mode:
        for path in removed:
            os.unlink(path)
    return written, removed


def copy_where_different(source: str, dest: str, check_mode: bool = False) -> bool:
    """Copies `source` to `dest`, its mode kept, unless `dest` has that content and mode already; whether it
    did (in check mode, would)."""
    mode = os.stat(source).st_mode & 0o7777
    if os.path.isfile(dest) and sha1(dest) == sha1(source) and (os.stat(dest).st_mode & 0o7777) == mode:
        return False
    if not check_mode:
        copy_file(source, dest, mode)
    return True


def copy_file(source: str, dest: str, mode: int) -> None:
    """`source` to `dest` with `mode`, through a temporary file beside it (never half written)."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".keep-")
    os.close(handle)
    try:
        shutil.copyfile(source, temporary)
        os.chmod(temporary, mode)
        os.replace(temporary, dest)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["read", "keep", "restore"], "default": "read"},
            "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
            "unit_prefix": {"type": "str", "default": "vllm-fleet-"},
            "unit_marker": {"type": "str", "default": "^X-VllmFleet-Instance="},
            "config_dir": {"type": "path", "default": "/etc/vllm-fleet"},
            "state_dir": {"type": "path", "default": "/var/lib/vllm-fleet/applied"},
            "snapshot": {"type": "path"},
            "units": {"type": "list", "elements": "path", "default": []},
            "config": {"type": "list", "elements": "path", "default": []},
            "state_files": {"type": "list", "elements": "path", "default": []},
            "remove": {"type": "list", "elements": "path", "default": []},
        },
        required_if=[("state", "keep", ["snapshot"]), ("state", "restore", ["snapshot"])],
        supports_check_mode=True,
    )
    state, check_mode = module.params["state"], module.check_mode
    try:
        if state == "read":
            module.exit_json(changed=False, **read_config(module.params))
        if state == "restore":
            written, removed = restore_config(module.params, check_mode=check_mode)
            module.exit_json(changed=bool(written or removed), written=written, removed=removed)
        written = keep_config(module.params, check_mode=check_mode)
    except (OSError, re.error, UnicodeDecodeError) as exc:
        # a kept file gone (a snapshot pruned by hand), a folder not readable: the role's rescue says so
        module.fail_json(msg=f"vllm_fleet_rollout_config ({state}): {exc}")
    module.exit_json(changed=bool(written), written=written)


if __name__ == "__main__":
    main()
