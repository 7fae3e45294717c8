"""The rollout's files on the controller: each host's record (`hosts/<host>.json`) and the fleet summary
(`summary.json`) of the run folder, rewritten from every record there after each one. Reports about the run,
not changes to a managed host. The vllm_fleet_rollout_record action writes them in the controller's process
(two `ansible.builtin.copy` runs a record before, each a module run on the controller: issue 32)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_fleet.rollout.decisions import summarize


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON in `path`, mode 0644, through a temporary file beside it (a reader never sees
    half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(data, indent=4, sort_keys=True) + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def record_turn(
    run_dir: Path, host: str, record: Mapping[str, Any], targets: Sequence[str], started_at: float | None
) -> dict[str, Any]:
    """Writes `host`'s record, then the summary of every record in the run folder (the run not finished);
    returns that summary."""
    write_json(run_dir / "hosts" / f"{host}.json", dict(record))
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((run_dir / "hosts").glob("*.json"))]
    summary = summarize(targets, records, started_at=started_at, finished=False)
    write_json(run_dir / "summary.json", summary)
    return summary
