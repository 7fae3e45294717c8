#!/usr/bin/python
"""Small text files a role renders, written in one call: each file whose content, mode or owner differs is
replaced whole. `ansible.builtin.copy` with `content` costs a stat module run, a file transfer and a copy
module run per file; the role's files (an instance's unit and plan, its applied digest) are a few KiB, so
they travel in the module's arguments instead (issue 32). The role decides which files differ from one read of
the host (vllm_fleet_host_state); this module writes them."""

from __future__ import annotations

import grp
import os
import pwd
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: vllm_fleet_files
short_description: Write several small text files in one call, each only where it differs
description:
  - For each of O(files), writes O(files[].content) to O(files[].path) with O(files[].mode),
    O(files[].owner) and O(files[].group) where the file is missing or differs in any of them, replacing
    it whole (a temporary file beside it, then a rename).
  - In check mode nothing is written; with C(--diff) each file whose content changes gives a diff.
  - For the files a role renders in full on the controller (a systemd unit, a JSON plan, a digest), a few
    KiB each, carried in the module's arguments, one round trip for all of them.
version_added: "0.1.0"
options:
  files:
    description: The files to write.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Where the file goes; its folder must exist.
        type: path
        required: true
      content:
        description: The whole text of the file.
        type: str
        required: true
      mode:
        description: Its mode, octal (C(0644)).
        type: str
        default: "0644"
      owner:
        description: Its owner.
        type: str
        default: root
      group:
        description: Its group.
        type: str
        default: root
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Write a unit and its plan where they differ
  vllm_fleet.serving.vllm_fleet_files:
    files:
      - {path: /etc/systemd/system/vllm-fleet-i0.service, content: "{{ unit_text }}"}
      - {path: /etc/vllm-fleet/i0.json, content: "{{ plan | to_json }}"}
"""

RETURN = r"""
written:
  description: The paths written (in check mode, that would be written), in the order given.
  type: list
  elements: str
  returned: always
"""


def wanted(spec: dict) -> tuple[bytes, int, int, int]:
    """(content, mode, uid, gid) the file must have."""
    uid = pwd.getpwnam(spec["owner"]).pw_uid
    gid = grp.getgrnam(spec["group"]).gr_gid
    return spec["content"].encode("utf-8"), int(spec["mode"], 8), uid, gid


def current(path: str) -> tuple[bytes, int, int, int] | None:
    """(content, mode, uid, gid) of the file; None when it is missing."""
    try:
        info = os.lstat(path)
        with open(path, "rb") as handle:
            return handle.read(), info.st_mode & 0o7777, info.st_uid, info.st_gid
    except FileNotFoundError:
        return None


def write(path: str, content: bytes, mode: int, uid: int, gid: int) -> None:
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
        os.chown(temporary, uid, gid)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_files(files: list[dict], check_mode: bool = False) -> tuple[list[str], list[dict]]:
    """(the paths written, a diff per file whose content changed)."""
    written, diffs = [], []
    for spec in files:
        path = spec["path"]
        target = wanted(spec)
        before = current(path)
        if before == target:
            continue
        written.append(path)
        if before is None or before[0] != target[0]:
            diffs.append(
                {
                    "before_header": path,
                    "after_header": path,
                    "before": before[0].decode("utf-8", errors="replace") if before else "",
                    "after": spec["content"],
                }
            )
        if not check_mode:
            write(path, *target)
    return written, diffs


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "content": {"type": "str", "required": True},
                    "mode": {"type": "str", "default": "0644"},
                    "owner": {"type": "str", "default": "root"},
                    "group": {"type": "str", "default": "root"},
                },
            },
        },
        supports_check_mode=True,
    )
    try:
        written, diffs = write_files(module.params["files"], check_mode=module.check_mode)
    except (KeyError, OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot write {exc}")
    result = {"changed": bool(written), "written": written}
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
