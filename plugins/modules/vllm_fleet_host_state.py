#!/usr/bin/python
"""One read of what a role manages on the host: the stat and sha256 of its files, the contents of its small
state files, the state of its systemd units. A converged re-run then compares on the controller and writes
nothing (issue 21): one round trip per role instead of one (or two) per file and unit."""

from __future__ import annotations

import glob
import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: vllm_fleet_host_state
short_description: Stat and sha256 of files, small file contents and systemd unit states, in one call
description:
  - Reads, in one module call (one round trip), what a role manages on the host, so that the role compares it
    on the controller with what the plan renders (P(vllm_fleet.serving.vllm_fleet_drifted#filter)) and writes
    only what differs. A converged host then costs one call per role.
  - For every path of O(paths), C(lstat) and, for a regular file, its sha256; for every path of O(read), its
    text (a digest or marker file, at most 64 KiB); for the units of O(units), one
    C(systemctl show) with C(ActiveState), C(UnitFileState), C(NeedDaemonReload) and C(LoadState).
  - Changes nothing on the host.
version_added: "0.1.0"
options:
  paths:
    description: Files and directories whose stat (and sha256 for a regular file) is returned.
    type: list
    elements: path
    default: []
  read:
    description: Small files whose text is returned (a missing file is left out of RV(contents)).
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose state is returned (one C(systemctl show) for all).
    type: list
    elements: str
    default: []
  compare_sha256:
    description:
      - Path -> the sha256 the controller expects, for files whose digest must not leave the host (a file
        holding secrets, whose plain sha256 would be a fast oracle for a short key). Each path is stat'ed as
        in O(paths), but its stat holds C(sha256_matches) (true or false) instead of C(sha256).
      - The values are masked in the task's output (C(no_log)).
    type: dict
    default: {}
  globs:
    description: Shell patterns; the text of every file that matches (at most 64 KiB each) is returned in
      RV(globbed), e.g. the marker lines of the units a role once wrote, to find the ones it must remove.
    type: list
    elements: str
    default: []
  users:
    description: Accounts whose passwd entry is returned in RV(accounts) (primary group name, home, shell).
    type: list
    elements: str
    default: []
  groups:
    description: Groups whose existence is returned in RV(accounts).
    type: list
    elements: str
    default: []
  venv:
    description:
      - A Python venv whose state is returned in RV(venv), read by its own interpreter in one process (no
        pip; C(importlib.metadata) sees what C(vllm serve) sees), that is whether its python runs, its
        C(site-packages) (purelib) and every installed distribution with its version.
      - Empty for none.
    type: path
    default: ""
  venv_globs:
    description: Shell patterns relative to the venv's site-packages (e.g. C(vllm-*.dist-info) and
      C(vllm-*.dist-info/*)); the stat (and sha256) of every match is returned in RV(venv)'s C(globbed).
    type: list
    elements: str
    default: []
  trees:
    description:
      - Destination directory -> source directory, both on the host; RV(trees) says whether the destination
        holds the same entries (relative paths and types), the same sizes and, for the files of at most
        O(tree_hash_limit) bytes, the same sha256 (a pre-staged model copied in place).
      - Files bigger than that are compared by size only, so that a re-run does not read the weights (hundreds
        of GB) again.
    type: dict
    default: {}
  tree_hash_limit:
    description: The largest file, in bytes, whose contents O(trees) compares.
    type: int
    default: 1048576
  commands:
    description:
      - Name -> a read-only shell command (C(/bin/sh -c)), each run in turn; RV(commands) holds its status,
        stdout and stderr (status 127 - not found - for a missing binary). For the fixed probe commands of
        the gpu_topology_facts action (one round trip for all of them); never a command built from the
        inventory.
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Read what the role manages, in one call
  vllm_fleet.serving.vllm_fleet_host_state:
    paths: [/etc/sysctl.d/90-vllm-fleet.conf, /etc/vllm-fleet]
    read: [/var/lib/vllm-fleet/state/a]
    units: [vllm-fleet-a.service]
    compare_sha256: {/etc/vllm-fleet/a.env: "{{ env_text | hash('sha256') }}"}
    globs: [/etc/systemd/system/vllm-fleet-*.service]
  register: state
"""

RETURN = r"""
files:
  description: Path -> stat. C(exists) false for a missing path; otherwise C(type) (C(file), C(directory),
    C(link), C(other)), C(mode) (4 octal digits, as a string), C(owner), C(group) and, for a file, C(sha256)
    (or C(sha256_matches) for a path of O(compare_sha256)).
  type: dict
  returned: always
contents:
  description: Path -> text of each O(read) file that exists (its first 64 KiB).
  type: dict
  returned: always
truncated:
  description: The O(read) files and the files O(globs) matched that are longer than 64 KiB, whose text in
    RV(contents) or RV(globbed) is cut (a reader of a whole document must refuse them).
  type: list
  returned: always
globbed:
  description: Pattern of O(globs) -> {path -> text} of the files it matches.
  type: dict
  returned: always
units:
  description: Unit -> C(ActiveState), C(UnitFileState), C(NeedDaemonReload), C(LoadState) as systemctl says.
  type: dict
  returned: always
accounts:
  description: C(users) (name -> C(exists), C(group), C(home), C(shell)) and C(groups) (name -> C(exists)).
  type: dict
  returned: always
venv:
  description: C(python) (the venv's interpreter ran), C(purelib), C(distributions) (normalized name ->
    version), C(globbed) (O(venv_globs) pattern -> {path -> stat}) and C(error) (why the interpreter did not
    run, else empty); C({}) without O(venv).
  type: dict
  returned: always
trees:
  description: Destination of O(trees) -> C(same) (true or false) and C(why) (the first difference found).
  type: dict
  returned: always
commands:
  description: Name of O(commands) -> C(rc), C(stdout), C(stderr).
  type: dict
  returned: always
"""

# Run by the venv's own interpreter: its purelib and every distribution importlib.metadata finds there.
VENV_SCRIPT = (
    "import importlib.metadata as m, json, re, sysconfig\n"
    "dists = {}\n"
    "for d in m.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name:\n"
    "        dists.setdefault(re.sub(r'[-_.]+', '-', name).lower(), d.version)\n"
    "print(json.dumps({'purelib': sysconfig.get_paths()['purelib'], 'distributions': dists}))\n"
)
PROPERTIES = ("ActiveState", "UnitFileState", "NeedDaemonReload", "LoadState")
READ_LIMIT = 64 * 1024


def _name(lookup, ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:  # a numeric owner without a passwd/group entry
        return str(ident)


def file_state(path: str) -> dict:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    kind = (
        "link"
        if stat.S_ISLNK(st.st_mode)
        else "directory"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "other"
    )
    out = {
        "exists": True,
        "type": kind,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
    }
    if kind == "file":
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out["sha256"] = digest.hexdigest()
    return out


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(READ_LIMIT).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None


def longer_than_limit(path: str) -> bool:
    try:
        return os.path.getsize(path) > READ_LIMIT
    except OSError:
        return False


def truncated_paths(contents: dict[str, str], globbed: dict[str, dict[str, str]]) -> list[str]:
    """The files read (O(read) and the matches of O(globs)) whose text was cut at READ_LIMIT."""
    read = [*contents, *(path for texts in globbed.values() for path in texts)]
    return sorted({path for path in read if longer_than_limit(path)})


def compared_state(path: str, expected_sha256: str) -> dict:
    """file_state without the file's sha256: only whether it is the one expected."""
    out = file_state(path)
    if "sha256" in out:
        out["sha256_matches"] = out.pop("sha256") == str(expected_sha256).strip().lower()
    return out


def globbed_texts(patterns: list[str]) -> dict[str, dict[str, str]]:
    """Pattern -> {path -> text} of the regular files it matches, in sorted order."""
    out: dict[str, dict[str, str]] = {}
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        out[pattern] = {p: text for p in matches if (text := read_text(p)) is not None}
    return out


def accounts(users: list[str], groups: list[str]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {"users": {}, "groups": {}}
    for name in users:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            out["users"][name] = {"exists": False}
            continue
        out["users"][name] = {
            "exists": True,
            "group": _name(grp.getgrgid, entry.pw_gid),
            "home": entry.pw_dir,
            "shell": entry.pw_shell,
        }
    for name in groups:
        try:
            grp.getgrnam(name)
            out["groups"][name] = {"exists": True}
        except KeyError:
            out["groups"][name] = {"exists": False}
    return out


def venv_state(venv: str, patterns: list[str], run=subprocess.run) -> dict:
    """The venv read by its own python (one process), and the stat of what `patterns` match in its purelib."""
    python = os.path.join(venv, "bin", "python")
    out: dict = {"python": False, "purelib": None, "distributions": {}, "globbed": {}, "error": ""}
    if not os.access(python, os.X_OK):  # follows the link: a venv whose interpreter is gone does not run
        out["error"] = f"{python} is missing or not executable"
        return out
    try:
        proc = run(
            [python, "-I", "-c", VENV_SCRIPT], capture_output=True, text=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"{python}: {exc}"
        return out
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (IndexError, ValueError):
        data = None
    if not isinstance(data, dict):
        out["error"] = f"{python} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}"
        return out
    out.update(python=True, purelib=data["purelib"], distributions=data["distributions"])
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.join(data["purelib"], pattern)))
        out["globbed"][pattern] = {path: file_state(path) for path in matches}
    return out


def _tree(root: str) -> dict[str, tuple[str, int]]:
    """Relative path -> (type, size) of every entry below root (links not followed)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
            out[os.path.relpath(path, root)] = (kind, st.st_size if kind == "file" else 0)
    return out


def tree_same(dest: str, src: str, hash_limit: int) -> dict:
    """Whether dest holds what src holds: the same entries and sizes, the same bytes for small files."""
    if not os.path.isdir(src):
        return {"same": False, "why": f"the source {src} is not a directory"}
    if not os.path.isdir(dest):
        return {"same": False, "why": f"{dest} is missing"}
    have, want = _tree(dest), _tree(src)
    for rel in sorted(want):
        if rel not in have:
            return {"same": False, "why": f"{rel} is missing"}
        if have[rel] != want[rel]:
            return {"same": False, "why": f"{rel}: {have[rel]}, not {want[rel]} (type, size)"}
        kind, size = want[rel]
        small = kind == "file" and size <= hash_limit
        if (
            small
            and file_state(os.path.join(dest, rel))["sha256"] != file_state(os.path.join(src, rel))["sha256"]
        ):
            return {"same": False, "why": f"{rel}: content differs"}
    return {"same": True, "why": ""}


def run_commands(commands: dict[str, str], run=subprocess.run) -> dict[str, dict]:
    out = {}
    for name, command in commands.items():
        proc = run(["/bin/sh", "-c", str(command)], capture_output=True, text=True, check=False)
        out[name] = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    return out


def parse_show(text: str, units: list[str]) -> dict[str, dict[str, str]]:
    """`systemctl show -p A,B u1 u2` prints one block of KEY=value lines per unit, blank-line separated,
    in the order asked."""
    blocks = [b for b in text.strip("\n").split("\n\n")] if text.strip() else []
    out = {}
    for unit, block in zip(units, blocks, strict=False):  # a count mismatch is checked by the caller
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        out[unit] = {p: props.get(p, "") for p in PROPERTIES}
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "read": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "compare_sha256": {"type": "dict", "default": {}, "no_log": True},
            "globs": {"type": "list", "elements": "str", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "groups": {"type": "list", "elements": "str", "default": []},
            "venv": {"type": "path", "default": ""},
            "venv_globs": {"type": "list", "elements": "str", "default": []},
            "trees": {"type": "dict", "default": {}},
            "tree_hash_limit": {"type": "int", "default": 1048576},
            "commands": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    files = {path: file_state(path) for path in params["paths"]}
    files.update({path: compared_state(path, sha) for path, sha in params["compare_sha256"].items()})
    contents = {path: text for path in params["read"] if (text := read_text(path)) is not None}
    globbed = globbed_texts(params["globs"])
    units: dict[str, dict[str, str]] = {}
    if params["units"]:
        proc = subprocess.run(
            ["systemctl", "show", f"--property={','.join(PROPERTIES)}", "--", *params["units"]],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            module.fail_json(msg=f"vllm_fleet_host_state: systemctl show failed: {proc.stderr.strip()}")
        units = parse_show(proc.stdout, params["units"])
        if len(units) != len(params["units"]):
            module.fail_json(
                msg=f"vllm_fleet_host_state: systemctl show gave {len(units)} blocks for "
                f"{len(params['units'])} units: {proc.stdout!r}"
            )
    module.exit_json(
        changed=False,
        files=files,
        contents=contents,
        truncated=truncated_paths(contents, globbed),
        units=units,
        globbed=globbed,
        accounts=accounts(params["users"], params["groups"]),
        venv=venv_state(params["venv"], params["venv_globs"]) if params["venv"] else {},
        commands=run_commands(params["commands"]),
        trees={
            dest: tree_same(dest, str(src), params["tree_hash_limit"])
            for dest, src in params["trees"].items()
        },
    )


if __name__ == "__main__":
    main()
