"""What a role would write, compared with one read of the host (the module vllm_fleet_host_state): the items
whose file or directory differs from the plan (issue 21). A converged host gives an empty list, so the role's
write loops run zero times and cost no round trip."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from vllm_fleet.errors import FleetInputError


def content_sha256(text: str) -> str:
    """The sha256 of the bytes ansible.builtin.copy writes for `content: text` (UTF-8, as given)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def why_drifted(item: Mapping[str, Any], seen: Mapping[str, Any] | None) -> str:
    """Why the host's `seen` (vllm_fleet_host_state's stat of item["path"]) differs from `item`, or ""."""
    if not seen or not seen.get("exists"):
        return "missing"
    kind = item.get("state", "file")
    if seen.get("type") != kind:
        return f"is a {seen.get('type')}, not a {kind}"
    if kind == "file" and "content" in item:
        # A file compared on the host (a secret's digest never leaves it): only whether it matched.
        same = (
            bool(seen["sha256_matches"])
            if "sha256_matches" in seen
            else seen.get("sha256") == content_sha256(str(item["content"]))
        )
        if not same:
            return "content differs"
    for key in ("owner", "group"):
        if key in item and str(item[key]) != str(seen.get(key)):
            return f"{key} {seen.get(key)}, not {item[key]}"
    if "mode" in item and int(str(item["mode"]), 8) != int(str(seen.get("mode", "0")), 8):
        return f"mode {seen.get('mode')}, not {item['mode']}"
    return ""


def drifted(
    items: list[Mapping[str, Any]], files: Mapping[str, Any], *, path_key: str = "path"
) -> list[dict[str, Any]]:
    """The items of `items` (each with its path under `path_key`, and optionally content, state, owner,
    group, mode) that the host's `files` (path -> stat) does not match, in order, each with "drift": why."""
    out = []
    for item in items:
        if path_key not in item:
            raise FleetInputError(
                f"vllm_fleet_drifted: an item has no {path_key!r} key ({sorted(item)}); "
                f"pass path_key= the key that holds each item's path on the host"
            )
        path = str(item[path_key])
        if path not in files:
            raise FleetInputError(
                f"vllm_fleet_drifted: {path} was not read on the host; add it to the paths of "
                f"vllm_fleet.serving.vllm_fleet_host_state"
            )
        why = why_drifted(item, files[path])
        if why:
            out.append({**item, "drift": why})
    return out


FILE_SPEC_KEYS = ("path", "content", "mode", "owner", "group")


def file_writes(items: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The files of `items` (each with its "content") as the module vllm_fleet_files takes them: path,
    content and, where the item has them, mode, owner and group (nothing else: the module refuses other
    keys)."""
    missing = [str(item.get("path")) for item in items if "content" not in item or "path" not in item]
    if missing:
        raise FleetInputError(f"vllm_fleet_file_writes: no path or content for {', '.join(missing)}")
    return [{key: item[key] for key in FILE_SPEC_KEYS if key in item} for item in items]
