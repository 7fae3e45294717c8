"""ExecStart= quoting, checked by systemd itself (systemd 252 of this machine, no running systemd needed).

1. `systemd-analyze verify --root=R` on a unit whose ExecStart comes from `render.systemd_quote`: any output
   fails (it exits 0 on warnings). R holds a copy of /lib/systemd/system and the executables the unit names.
2. Read back: `systemd --test --system --unit=U` (systemd's own manager in test mode, run as an unprivileged
   user as it demands) loads the unit with the real unit-file parser and dumps it; its `Command Line:` is the
   parsed argv, quoted by systemd's quote_command_line. Decoding that must give the argv we meant, after the
   one exec-time rule the dump does not apply yet: `$$` becomes `$` (systemd.service(5), "Command lines").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_fleet.render import render_instance, systemd_quote
from vllm_fleet.schema import ServeSpec

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture(autouse=True)
def _systemd_tools():
    missing = [t for t in ("systemd-analyze", "setpriv") if shutil.which(t) is None]
    missing += [] if Path("/lib/systemd/systemd").exists() else ["/lib/systemd/systemd"]
    assert not missing, f"install systemd and util-linux (missing: {missing}); these checks need them"


TRICKY_ARGV = [
    "/usr/bin/python3",
    "-c",
    "import json,sys; print(json.dumps(sys.argv[1:]))",
    "100%",
    "%n",
    "$HOME",
    "${PATH}",
    "a b",
    '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{"root_dir":"/kv dir",'
    '"x":{"y":"$z %i"}}}',
    "back\\slash",
    "it's",
    ";",
    "",
    "tab\there",
    "--flag=a b",
]


def _root(tmp_path: Path, executables: list[str]) -> Path:
    root = tmp_path / "root"
    shutil.copytree("/lib/systemd/system", root / "lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for exe in executables:
        target = root / exe.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\n", encoding="utf-8")
        target.chmod(0o755)
    return root


def _write_unit(root: Path, name: str, argv: list[str]) -> Path:
    unit = root / "etc/systemd/system" / name
    unit.write_text(
        "[Unit]\nDescription=vllm-fleet quoting check\n\n[Service]\nType=simple\n"
        f"ExecStart={systemd_quote(argv)}\n\n[Install]\nWantedBy=multi-user.target\n",
        encoding="utf-8",
    )
    return unit


def _verify(root: Path, name: str) -> str:
    proc = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", f"/etc/systemd/system/{name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (proc.stdout + proc.stderr).strip() + ("" if proc.returncode == 0 else f"\nexit {proc.returncode}")


def _systemd_dump_command_line(unit_dir: Path, name: str, first_word: str) -> str:
    for path in [unit_dir, *unit_dir.parents]:
        os.chmod(path, os.stat(path).st_mode | 0o005)
    for child in unit_dir.iterdir():
        os.chmod(child, 0o644)
    env = {"SYSTEMD_UNIT_PATH": f"{unit_dir}:", "SYSTEMD_LOG_TARGET": "console", "PATH": os.environ["PATH"]}
    proc = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "/lib/systemd/systemd",
            "--test",
            "--system",
            f"--unit={name}",
            "--no-pager",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("Command Line: ")]
    ours = [
        line[len("Command Line: ") :]
        for line in lines
        if line[len("Command Line: ") :].startswith(first_word)
    ]
    assert len(ours) == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ours[0]


_C_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def decode_systemd_quoted(line: str) -> list[str]:
    """Words of systemd's quote_command_line output: bare words, or "..." with \\-escapes (shell + C)."""
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        word = []
        if line[i] == '"':
            i += 1
            while line[i] != '"':
                if line[i] == "\\":
                    nxt = line[i + 1]
                    if nxt == "x":
                        word.append(chr(int(line[i + 2 : i + 4], 16)))
                        i += 4
                        continue
                    word.append(_C_ESCAPES.get(nxt, nxt))
                    i += 2
                    continue
                word.append(line[i])
                i += 1
            i += 1
        else:
            while i < len(line) and line[i] != " ":
                word.append(line[i])
                i += 1
        words.append("".join(word))
    return words


def at_exec_time(word: str) -> str:
    """systemd's exec-time step the dump has not applied: `$$` is a literal `$` (no variable here)."""
    return re.sub(r"\$\$", "$", word)


def test_tricky_words_survive_systemd(tmp_path):
    root = _root(tmp_path, ["/usr/bin/python3"])
    _write_unit(root, "quoting.service", TRICKY_ARGV)
    assert _verify(root, "quoting.service") == ""
    line = _systemd_dump_command_line(root / "etc/systemd/system", "quoting.service", "/usr/bin/python3")
    assert [at_exec_time(w) for w in decode_systemd_quoted(line)] == TRICKY_ARGV


def test_unescaped_percent_is_what_systemd_would_mangle(tmp_path):
    """The negative control: without the escaping, systemd reads a different argv (so the check can fail)."""
    root = _root(tmp_path, ["/usr/bin/python3"])
    unit = root / "etc/systemd/system/raw.service"
    unit.write_text('[Service]\nExecStart=/usr/bin/python3 -c x "100%n" "{"a":1}"\n', encoding="utf-8")
    line = _systemd_dump_command_line(root / "etc/systemd/system", "raw.service", "/usr/bin/python3")
    words = decode_systemd_quoted(line)
    assert words[3] == "100raw.service"  # %n is the unit name
    assert words[4:] == ["{a:1}"]  # the inner quotes end and restart the word


def test_seed_exec_start_verifies_and_reads_back(tmp_path):
    from vllm_fleet.layout import plan_layout
    from vllm_fleet.topology import build_topology_from_dir

    variables = yaml.safe_load(
        (REPO / "inventory/examples/seed-4x4090/group_vars/all/vllm_service.yml").read_text(encoding="utf-8")
    )
    variables["vllm_service_extra_args"] = ["--chat-template-content-format", "string"]
    layout = plan_layout(
        build_topology_from_dir(REPO / "tests/fixtures/topology/recorded/8x4090-dual-socket"), 4
    )
    model = json.loads((REPO / "tests/fixtures/models/qwen3.6-27b.config.json").read_text(encoding="utf-8"))
    rendered = render_instance(
        ServeSpec.from_vars(variables), layout.to_dict()["instances"][0], "0.33.0", model_config=model
    )
    assert rendered.errors == []
    root = _root(tmp_path, ["/usr/bin/numactl"])
    unit = root / "etc/systemd/system/vllm-fleet-i0.service"
    unit.write_text(f"[Service]\nExecStart={rendered.exec_start}\n", encoding="utf-8")
    assert _verify(root, "vllm-fleet-i0.service") == ""
    line = _systemd_dump_command_line(
        root / "etc/systemd/system", "vllm-fleet-i0.service", "/usr/bin/numactl"
    )
    assert [at_exec_time(w) for w in decode_systemd_quoted(line)] == rendered.argv
