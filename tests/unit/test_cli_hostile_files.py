"""Every CLI that reads a file, over every kind of hostile file: a clean refusal, never a traceback
(issue 31).

`render`, `plan`, `logcheck`, `verify --replay` and `monitoring` each get, in each file they read, an empty
file, binary, bytes that are not UTF-8, NULs, a file over the read limit, JSON nested 100,000 deep, JSON of
the wrong kind, escape sequences, a directory, a missing path; and each top-level field of a real input (the
H200 recording's plan.json and answers.json, the seed's vars, a monitoring plan) replaced by a value of each
wrong type. `main()` runs in-process: any exception but FleetInputError escapes it and fails the test with its
traceback. A refusal (exit 2) must name the input: its flag and the file.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_fleet.cli import main
from vllm_fleet.jsonfile import MAX_INPUT_BYTES

Capture = pytest.CaptureFixture[str]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
H200 = FIXTURES / "gpu-h200-vllm-0.26.0" / "seed-dense"
SEED = ROOT / "inventory" / "examples" / "seed-4x4090"
SEED_VARS = SEED / "group_vars" / "all" / "vllm_service.yml"
TINY_CONFIG = FIXTURES / "models" / "lab-tiny-qwen2.config.json"


def hostile_files(folder: Path) -> dict[str, Path]:
    """name -> a file (or folder, or missing path) of that kind."""
    contents: dict[str, bytes] = {
        "empty": b"",
        "binary": bytes(range(256)) * 64,
        "not-utf8": b'\xff\xfe{"a": 1}',
        "nul": b"\x00" * 4096,
        "deep-list": b"[" * 100_000,
        "deep-object": b'{"a": ' * 20_000 + b"1" + b"}" * 20_000,
        "json-list": b"[1, 2, 3]",
        "json-number": b"1e999",
        "json-nan": b'{"a": NaN, "b": Infinity}',
        "escapes": b'\x1b]0;pwned\x07{"a": "\x1b[2J"}\r\x08',
        "yaml-aliases": b"a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        b"e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
        "long-number": b'{"num_hidden_layers": ' + b"9" * 5000 + b"}",
    }
    files = {}
    for name, data in contents.items():
        files[name] = folder / f"{name}.json"
        files[name].write_bytes(data)
    files["huge"] = folder / "huge.json"
    with files["huge"].open("wb") as handle:
        handle.write(b'{"a": "')
        handle.truncate(MAX_INPUT_BYTES + 16)
    files["directory"] = folder / "a-directory"
    files["directory"].mkdir()
    files["missing"] = folder / "missing.json"
    return files


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return hostile_files(tmp_path_factory.mktemp("hostile"))


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def refused_naming(code: int, err: str, flag: str, path: Path) -> None:
    assert code == 2, err
    assert flag in err and (str(path) in err or path.name in err), err
    assert err.startswith("vllm-fleet ") and err.count("\n") == 1, err


# (CLI, the flag under test, argv builder given the hostile path)
def _render(flag: str) -> Callable[[Path], list[str]]:
    def argv(path: Path) -> list[str]:
        base = {"--vars": str(SEED_VARS), "--model-config": str(TINY_CONFIG)}
        base[flag] = str(path)
        return ["render", "--vllm-version", "0.33.0", *(x for kv in base.items() for x in kv)]

    return argv


def _verify(flag: str) -> Callable[[Path], list[str]]:
    def argv(path: Path) -> list[str]:
        base = {"--plan": str(H200 / "plan.json"), "--replay": str(H200 / "answers.json")}
        base[flag] = str(path)
        return ["verify", *(x for kv in base.items() for x in kv), "--host", "h200"]

    return argv


READERS: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "render --vars": ("--vars", _render("--vars")),
    "render --model-config": ("--model-config", _render("--model-config")),
    "render --instance-json": ("--instance-json", _render("--instance-json")),
    "render --topology-json": ("--topology-json", _render("--topology-json")),
    "plan --model-config": (
        "--model-config",
        lambda p: ["plan", "--model-config", str(p), "--kv-bytes-per-gpu", "1G", "--max-model-len", "256"],
    ),
    "verify --plan": ("--plan", _verify("--plan")),
    "verify --replay": ("--replay", _verify("--replay")),
    "verify --log": ("--log", lambda p: [*_verify("--replay")(H200 / "answers.json"), "--log", str(p)]),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize(
    "kind",
    [
        "empty", "binary", "not-utf8", "nul", "deep-list", "deep-object", "json-list", "json-number",
        "json-nan", "escapes", "yaml-aliases", "long-number", "huge", "directory", "missing",
    ],
)  # fmt: skip
def test_a_hostile_file_is_refused_by_name(
    reader: str, kind: str, hostile: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    flag, argv = READERS[reader]
    path = hostile[kind]
    code, _, err = run(capsys, argv(path))
    if flag == "--log" and kind not in ("empty", "directory", "missing"):
        assert code in (0, 1), err  # a log of anything is read; what it lacks fails a check
        return
    if flag == "--vars" and kind in ("json-nan", "yaml-aliases", "not-utf8"):
        assert code == 2 and "vllm_service_model: not set" in err, err  # a mapping: its variables are checked
        return
    refused_naming(code, err, flag, path)
    assert "\x1b" not in err and "\x07" not in err


@pytest.mark.parametrize(
    "kind", ["empty", "binary", "not-utf8", "nul", "deep-list", "escapes", "long-number", "huge"]
)
def test_logcheck_reads_any_file_and_refuses_what_is_no_file(
    kind: str, hostile: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, ["logcheck", str(hostile[kind]), "--expect-ready"])
    assert code == 1 and "ready" in out and "\x1b" not in out, err
    assert ("long lines cut        1 line(s) over 1,048,576 characters" in out) == (kind == "huge"), out
    code, _, err = run(capsys, ["logcheck", str(hostile[kind]), "--json"])
    assert code == 0, err
    for kind in ("directory", "missing"):
        code, _, err = run(capsys, ["logcheck", str(hostile[kind])])
        refused_naming(code, err, "logcheck FILE", hostile[kind])


WRONG = [None, [], {}, "x", -1, 1.5, True, "\x1b]0;pwned\x07"]


def mutations(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """(key, wrong value) for every top-level key and every key one level down."""
    found = [(key, value) for key in data for value in WRONG if value != data[key]]
    for key, inner in data.items():
        if isinstance(inner, dict):
            found += [(f"{key}.{sub}", value) for sub in inner for value in WRONG[:5] if value != inner[sub]]
    return found


def mutated(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(data)
    *path, last = key.split(".")
    inner = result
    for part in path:
        inner = inner[part]
    inner[last] = value
    return result


PLAN = json.loads((H200 / "plan.json").read_text(encoding="utf-8"))
ANSWERS = json.loads((H200 / "answers.json").read_text(encoding="utf-8"))
VARS = yaml.safe_load(SEED_VARS.read_text(encoding="utf-8"))


@pytest.mark.parametrize(("key", "value"), mutations(PLAN), ids=lambda v: repr(v)[:20])
def test_verify_plan_of_wrong_types(key: str, value: Any, tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(mutated(PLAN, key, value)))
    code, _, err = run(capsys, _verify("--plan")(path))
    assert code in (0, 1) or (code == 2 and "--plan" in err), err


@pytest.mark.parametrize(("key", "value"), mutations(ANSWERS), ids=lambda v: repr(v)[:20])
def test_verify_replay_of_wrong_types(key: str, value: Any, tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(mutated(ANSWERS, key, value)))
    code, _, err = run(capsys, _verify("--replay")(path))
    assert code in (0, 1) or (code == 2 and "--replay" in err and key.split(".")[0] in err), err


@pytest.mark.parametrize(("key", "value"), mutations(VARS), ids=lambda v: repr(v)[:20])
def test_render_vars_of_wrong_types(key: str, value: Any, tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "vars.yml"
    path.write_text(yaml.safe_dump(mutated(VARS, key, value)))
    code, _, err = run(capsys, _render("--vars")(path))
    assert code in (0, 1) or (code == 2 and key.split(".")[0] in err), err


@pytest.fixture(scope="module")
def host_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from vllm_fleet.plan.inventory import plan_inventory

    plans = plan_inventory(str(SEED), project_dir=ROOT)
    return plans["seed-4090"].to_dict()


def test_monitoring_plans_hostile_files(
    hostile: dict[str, Path], host_plan: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases: list[tuple[str, Any]] = [(kind, hostile[kind]) for kind in hostile if kind not in ("missing",)]
    cases += [(f"{key}={value!r}", mutated(host_plan, key, value)) for key, value in mutations(host_plan)]
    for name, source in cases:
        plans = tmp_path / "plans"
        shutil.rmtree(plans, ignore_errors=True)
        plans.mkdir()
        target = plans / "seed-4090.json"
        if isinstance(source, Path) and source.is_dir():
            target.mkdir()
        elif isinstance(source, Path):
            shutil.copyfile(source, target)
        else:
            target.write_text(json.dumps(source))
        out_dir = tmp_path / "out"
        argv = ["monitoring", "--inventory", str(SEED), "--out", str(out_dir), "--plans", str(plans)]
        code, _, err = run(capsys, argv)
        assert code == 0 or (code == 2 and "seed-4090.json" in err), (name, err)


@pytest.fixture(scope="module")
def facts_inventory(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The seed inventory planned from a probe report (reports/probe/<host>.json) instead of recorded outputs,
    and that report, rebuilt from the recorded 8 x RTX 4090 host the seed stands on."""
    from vllm_fleet.probe.topology import build_topology_from_dir

    inventory = tmp_path_factory.mktemp("inventory") / "seed"
    shutil.copytree(SEED, inventory)
    config = SEED.parent / "models" / "qwen3.6-27b.config.json"
    (inventory / "group_vars" / "all" / "facts.yml").write_text(f"vllm_service_model_config: {config}\n")
    topology = build_topology_from_dir(str(SEED.parent / "8x4090-dual-socket" / "recorded"))
    return inventory, {"topology": topology.to_dict()}


def test_plan_and_monitoring_over_a_hostile_probe_report(
    facts_inventory: tuple[Path, dict[str, Any]], hostile: dict[str, Path], tmp_path: Path, capsys: Capture
) -> None:
    inventory, report = facts_inventory
    cases: list[tuple[str, Any]] = [(kind, hostile[kind]) for kind in hostile if kind != "missing"]
    # the report itself and its topology of a wrong kind (fields of a wrong type: the test below)
    cases += [(f"topology={v!r}", {"topology": v}) for v in WRONG] + [("list", [report])]
    cases.append(("valid", report))
    for name, source in cases:
        probe = tmp_path / "probe"
        shutil.rmtree(probe, ignore_errors=True)
        probe.mkdir()
        target = probe / "seed-4090.json"
        if isinstance(source, Path) and source.is_dir():
            target.mkdir()
        elif isinstance(source, Path):
            shutil.copyfile(source, target)
        else:
            target.write_text(json.dumps(source))
        for argv in (
            ["plan", "--inventory", str(inventory), "--facts", str(probe), "--json"],
            [
                "monitoring",
                "--inventory",
                str(inventory),
                "--facts",
                str(probe),
                "--out",
                str(tmp_path / "m"),
            ],
        ):
            code, _, err = run(capsys, argv)
            if name == "valid":
                assert code == 0, err
            else:
                # refused naming the report, or planned from what it holds (an empty topology: plan errors)
                assert code in (0, 1) or (code == 2 and "seed-4090" in err), (name, argv[0], err)


# (what is changed in the probe report's topology, the path the message must name)
WRONG_FIELDS = [
    (("gpus", 0, "memory_mib"), "lots", "gpus[0]: memory_mib = 'lots'"),
    (("gpus", 0, "cpus"), "0-7", "gpus[0]: cpus = '0-7'"),
    (("gpus", 0, "index"), "a", "gpus[0]: index = 'a'"),
    (("gpus", 0, "numa_node"), 0.5, "gpus[0]: numa_node = 0.5"),
    (("gpus", 0, "pcie", "gen_max"), "four", "gpus[0].pcie: gen_max = 'four'"),
    (("gpus", 1), "GPU1", "gpus[1]: gpu = 'GPU1'"),
    (("gpus",), {"0": {}}, "topology: gpus = "),
    (("links",), "x", "topology: links = 'x'"),
    (("links", 0, 1), 7, "topology: links = "),
    (("numa_nodes",), [{"id": 0, "cpus": 5}], "numa_nodes[0]: cpus = 5"),  # the recording has none
    (("numa_nodes",), [{"id": None, "cpus": []}], "numa_nodes[0]: id = None"),
    (("numa_distances",), {"0": {"0": "ten"}}, "topology: numa_distances = "),
    (("sockets",), "two", "topology: sockets = 'two'"),
    (("p2p_read",), [["OK", 1]], "topology: p2p_read = "),
]


@pytest.mark.parametrize(("path", "value", "named"), WRONG_FIELDS, ids=[w[2] for w in WRONG_FIELDS])
def test_a_probe_report_with_a_field_of_the_wrong_type_is_refused_naming_it(
    facts_inventory: tuple[Path, dict[str, Any]], path: tuple[Any, ...], value: Any, named: str,
    tmp_path: Path, capsys: Capture,
) -> None:  # fmt: skip
    """Issue 31's gap: a topology whose fields had wrong types reached the layout (a TypeError there)."""
    inventory, report = facts_inventory
    damaged = copy.deepcopy(report)
    holder = damaged["topology"]
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "seed-4090.json").write_text(json.dumps(damaged))
    code, out, err = run(capsys, ["plan", "--inventory", str(inventory), "--facts", str(probe), "--json"])
    assert code == 2 and named in err and "run playbooks/probe.yml again" in err, (code, out[-300:], err)
    assert "Traceback" not in err
