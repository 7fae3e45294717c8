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

from vllm_fleet.render.schema import ServeSpec
from vllm_fleet.render.serve import render_instance, systemd_quote

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
    from vllm_fleet.plan.layout import plan_layout
    from vllm_fleet.probe.topology import build_topology_from_dir

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


# --- executed for real: a booted lab host (systemd-nspawn, real systemd 252 as PID 1, real numactl) ---------

FAKE_VLLM = "#!/usr/bin/python3\nimport json, sys\nprint('ARGV ' + json.dumps(sys.argv[1:]), flush=True)\n"

PLAYBOOK = """
- name: Run units whose ExecStart prints its own argv
  hosts: all
  gather_facts: false
  tasks:
    - name: Fake venv
      ansible.builtin.file: {path: /opt/fake-venv/bin, state: directory, mode: "0755"}
    - name: Fake vllm that prints its argv
      ansible.builtin.copy: {content: "{{ fake_vllm }}", dest: /opt/fake-venv/bin/vllm, mode: "0755"}
    - name: Units
      ansible.builtin.copy:
        content: "{{ item.text }}"
        dest: "/etc/systemd/system/{{ item.name }}"
        mode: "0644"
      loop: "{{ units }}"
    - name: Start them
      ansible.builtin.systemd_service: {name: "{{ item.name }}", state: started, daemon_reload: true}
      loop: "{{ units }}"
    - name: Read what they printed
      ansible.builtin.command: journalctl -u {{ item.name }} -o cat --no-pager
      loop: "{{ units }}"
      register: journals
      changed_when: false
    - name: Read ExecStart as systemd shows it
      ansible.builtin.command: systemctl show -p ExecStart --value {{ item.name }}
      loop: "{{ units }}"
      register: shows
      changed_when: false
    - name: Hand them back
      ansible.builtin.copy:
        content: "{{ {'journals': journals.results | map(attribute='stdout') | list,
                      'shows': shows.results | map(attribute='stdout') | list} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def lab_inventory(tmp_path_factory):
    venv_bin = Path(os.sys.executable).parent
    name = "h3quote"
    inventory = tmp_path_factory.mktemp("lab") / "inventory.yml"
    subprocess.run(
        [
            str(venv_bin / "vllm-fleet"),
            "lab",
            "up",
            "--name",
            name,
            "--hosts",
            "1",
            "--without-vllm",
            "--inventory",
            str(inventory),
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    try:
        yield inventory
    finally:
        subprocess.run(
            [str(venv_bin / "vllm-fleet"), "lab", "down", "--name", name],
            timeout=300,
            capture_output=True,
            check=False,
        )


@pytest.mark.lab
@pytest.mark.slow
def test_exec_start_runs_with_the_exact_argv_on_a_real_systemd(lab_inventory, tmp_path):
    from vllm_fleet.plan.layout import plan_layout
    from vllm_fleet.probe.topology import build_topology_from_dir

    variables = yaml.safe_load(
        (REPO / "inventory/examples/seed-4x4090/group_vars/all/vllm_service.yml").read_text(encoding="utf-8")
    )
    variables["vllm_service_venv"] = "/opt/fake-venv"
    # words systemd would otherwise rewrite: specifiers, variables, spaces, a lone semicolon
    variables["vllm_service_served_model_name"] = ["qwen3-27b", "100%n", "$HOME ${PATH}", ";"]
    layout = plan_layout(
        build_topology_from_dir(REPO / "tests/fixtures/topology/recorded/8x4090-dual-socket"), 4
    )
    instance = layout.to_dict()["instances"][0]
    rendered = render_instance(ServeSpec.from_vars(variables), instance, "0.33.0")
    assert rendered.argv[:3] == ["/usr/bin/numactl", "--cpunodebind=0", "--membind=0"]
    # the lab host has one NUMA node: 0 is valid there, so the real numactl runs the fake vllm
    units = [
        {"name": "vf-seed.service", "text": f"[Service]\nType=oneshot\nExecStart={rendered.exec_start}\n"},
        {
            "name": "vf-tricky.service",
            "text": "[Service]\nType=oneshot\nExecStart="
            + systemd_quote(["/opt/fake-venv/bin/vllm", *TRICKY_ARGV]),
        },
    ]
    out = tmp_path / "out.json"
    playbook = tmp_path / "run.yml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"units": units, "fake_vllm": FAKE_VLLM, "out": str(out)}), encoding="utf-8")
    venv_bin = Path(os.sys.executable).parent
    proc = subprocess.run(
        [str(venv_bin / "ansible-playbook"), "-i", str(lab_inventory), str(playbook), "-e", f"@{extra}"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ['PATH']}",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text(encoding="utf-8"))

    def printed(journal: str) -> list[str]:
        lines = [line for line in journal.splitlines() if line.startswith("ARGV ")]
        assert len(lines) == 1, journal
        return json.loads(lines[0][len("ARGV ") :])

    assert printed(data["journals"][0]) == rendered.argv[4:]  # after numactl's 3 words and the program
    assert printed(data["journals"][1]) == TRICKY_ARGV
    assert "path=/usr/bin/numactl" in data["shows"][0]
