#!/usr/bin/env python3
"""Generate src/vllm_fleet/data/flags.json, the `vllm serve` flag catalog per vLLM release.

The catalog is read from vLLM's real sources, never typed by hand: for every release (the package index's
list from 0.10.0 on, plus OLDER_RELEASES) the official wheel is fetched from PyPI (`pip download vllm==X
--no-deps`, one at a time), only its `vllm/**/*.py` files are kept in a cache outside the repository, the
wheel is deleted, and the sources are read with `ast`
(vLLM is never imported: its imports need torch and CUDA).

    .venv/bin/python scripts/gen_flag_catalog.py                 # ask the index, fetch what is missing, write
    .venv/bin/python scripts/gen_flag_catalog.py --index-from src/vllm_fleet/data/flags.json  # as recorded
    .venv/bin/python scripts/gen_flag_catalog.py --cache DIR --versions 0.32.0 0.33.0 --output -

What is extracted per release (see `extract_release`):
  flags            every option string the `vllm serve` parser accepts (EngineArgs.add_cli_args, the
                   frontend argument dataclasses of cli_args.py, the serve subcommand), with the dest, whether
                   it takes a value, its choices and its negated forms (BooleanOptionalAction `--no-x`,
                   EnableDisableAction `--disable-x`/`--enable-x`)
  json_keys        keys of the JSON-valued flags' dataclasses (speculative, compilation, kv-transfer)
  values           kv-cache dtypes, speculative methods, cudagraph modes, reasoning and tool-call parsers
  offloading       OffloadingConnector `kv_connector_extra_config` keys and the `fs` tier's arguments
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.lab.leftovers import leftovers

# Releases before FIRST_COVERED kept from earlier catalogs; from FIRST_COVERED on, every release the package
# index lists is catalogued (patch releases included), so no target is answered by a neighbour.
OLDER_RELEASES = ("0.8.5", "0.9.2")
FIRST_COVERED = "0.10.0"
DEFAULT_CACHE = leftovers().wheel_cache  # $VLLM_FLEET_WHEEL_CACHE; `vllm-fleet lab clean --all` removes it
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "src" / "vllm_fleet" / "data" / "flags.json"


# ----------------------------------------------------------------------------------------------- fetch


def source_dir(cache: Path, version: str) -> Path:
    return cache / "src" / version


def fetch(version: str, cache: Path, pip: str) -> Path:
    """Make sure the release's `vllm/**/*.py` sit in the cache; download the wheel only when missing."""
    dest = source_dir(cache, version)
    if (dest / "vllm" / "engine" / "arg_utils.py").is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="dl-") as tmp:
        subprocess.run(
            [pip, "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:", "-d", tmp, "-q"],
            check=True,
            timeout=900,
        )
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"pip download vllm=={version}: expected one wheel in {tmp}, found {wheels}")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    wheel.extract(name, partial)
        partial.rename(dest)
    return dest


def index_versions(pip: str) -> list[str]:
    """Every final release of vllm the package index lists (`pip index versions vllm`), oldest first."""
    out = subprocess.run(
        [pip, "index", "versions", "vllm"], check=True, capture_output=True, text=True, timeout=300
    ).stdout
    for line in out.splitlines():
        if line.startswith("Available versions:"):
            found = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
            return sorted(found, key=_version_key)
    raise SystemExit(f"pip index versions vllm: no 'Available versions:' line in {out!r}")


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+", 1)[0].replace(".post", ".")))


def covered_versions(index: list[str]) -> list[str]:
    """What the catalog holds: the older releases it always had, then every indexed release >= 0.10.0 that
    is not a post release (a .postN wheel carries its release's parser)."""
    first = _version_key(FIRST_COVERED)
    newer = [v for v in index if _version_key(v) >= first and "post" not in v]
    return [*OLDER_RELEASES, *newer]


# ------------------------------------------------------------------------------------------ source index


@dataclass
class Module:
    path: Path
    tree: ast.Module
    text: str


@dataclass
class SourceIndex:
    """The parsed files of one release, with module-level classes and type aliases looked up by name."""

    root: Path
    modules: dict[str, Module] = field(default_factory=dict)
    classes: dict[str, list[tuple[ast.ClassDef, Module]]] = field(default_factory=dict)
    aliases: dict[str, list[ast.expr]] = field(default_factory=dict)

    def load(self, rel: str) -> Module | None:
        if rel in self.modules:
            return self.modules[rel]
        path = self.root / rel
        if not path.is_file():
            return None
        text = path.read_text(encoding="utf-8")
        module = Module(path, ast.parse(text, filename=str(path)), text)
        self.modules[rel] = module
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, []).append((node, module))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    self.aliases.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.aliases.setdefault(node.target.id, []).append(node.value)
            elif type(node).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12 sources)
                self.aliases.setdefault(node.name.id, []).append(node.value)  # type: ignore[attr-defined]
        return module

    def load_glob(self, pattern: str) -> list[Module]:
        found = []
        for path in sorted(self.root.glob(pattern)):
            module = self.load(str(path.relative_to(self.root)))
            if module is not None:
                found.append(module)
        return found

    def class_def(self, name: str) -> ast.ClassDef | None:
        entries = self.classes.get(name)
        return entries[0][0] if entries else None

    def fields(self, class_name: str, _seen: frozenset[str] = frozenset()) -> dict[str, ast.expr]:
        """Annotated class-body fields of a (data)class, base classes first, as the dataclass sees them."""
        node = self.class_def(class_name)
        if node is None or class_name in _seen:
            return {}
        result: dict[str, ast.expr] = {}
        for base in node.bases:
            if isinstance(base, ast.Name):
                result.update(self.fields(base.id, _seen | {class_name}))
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if _is_classvar(stmt.annotation) or stmt.target.id.startswith("_"):
                    continue
                result[stmt.target.id] = stmt.annotation
        return result


def _is_classvar(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "InitVar"))


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def literal_values(index: SourceIndex, expr: ast.expr | None, depth: int = 0) -> list[str]:
    """The string values of a `Literal[...]` annotation, following unions, Optional and type aliases."""
    if expr is None or depth > 12:
        return []
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        try:  # a string annotation ("Literal['a']") is itself Python source
            return literal_values(index, ast.parse(expr.value, mode="eval").body, depth + 1)
        except SyntaxError:
            return []
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        return _unique(
            literal_values(index, expr.left, depth + 1) + literal_values(index, expr.right, depth + 1)
        )
    if isinstance(expr, ast.Subscript):
        head = ast.unparse(expr.value).split(".")[-1]
        items = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if head == "Literal":
            values: list[str] = []
            for item in items:
                text = _const_str(item)
                if text is not None:
                    values.append(text)
                else:
                    values.extend(literal_values(index, item, depth + 1))
            return _unique(values)
        if head in ("Optional", "Union", "Annotated"):
            chosen = items[:1] if head == "Annotated" else items
            return _unique([v for item in chosen for v in literal_values(index, item, depth + 1)])
        return []
    if isinstance(expr, ast.Name):
        return _unique(
            [v for alias in index.aliases.get(expr.id, []) for v in literal_values(index, alias, depth + 1)]
        )
    if isinstance(expr, ast.Call) and ast.unparse(expr.func).endswith("get_args") and expr.args:
        return literal_values(index, expr.args[0], depth + 1)
    return []


def annotation_has(expr: ast.expr, name: str) -> bool:
    return any(isinstance(node, ast.Name) and node.id == name for node in ast.walk(expr)) or (
        isinstance(expr, ast.Constant)
        and isinstance(expr.value, str)
        and re.search(rf"\b{name}\b", expr.value) is not None
    )


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


# -------------------------------------------------------------------------------------------- the flags


@dataclass
class Flag:
    options: list[str]
    dest: str
    takes_value: bool = True
    boolean: bool = False
    choices: list[str] | None = None
    negations: list[str] = field(default_factory=list)
    config_field: str | None = None
    deprecated: bool = False


ENGINE_FILES = ("vllm/engine/arg_utils.py",)
FRONTEND_GLOBS = (
    "vllm/entrypoints/openai/cli_args.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/entrypoints/common/cli_args.py",
    "vllm/entrypoints/cli/serve.py",
)
CONFIG_GLOBS = ("vllm/config.py", "vllm/config/*.py", "vllm/engine/arg_utils.py")


def _get_kwargs_uses_boolean_optional(index: SourceIndex) -> bool:
    module = index.load("vllm/engine/arg_utils.py")
    assert module is not None
    return any(
        isinstance(node, ast.FunctionDef)
        and node.name in ("get_kwargs", "_compute_kwargs")
        and "BooleanOptionalAction" in ast.unparse(node)
        for node in ast.walk(module.tree)
    )


def _has_enable_disable_action(index: SourceIndex) -> bool:
    for rel in ("vllm/utils/argparse_utils.py", "vllm/utils/__init__.py", "vllm/utils.py"):
        module = index.load(rel)
        if module and "class EnableDisableAction" in module.text:
            return True
    return False


def _kwargs_sources(func: ast.AST) -> dict[str, str]:
    """`cache_kwargs = get_kwargs(CacheConfig)` inside a function: kwargs variable -> dataclass name."""
    found: dict[str, str] = {}
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("get_kwargs")
            and node.value.args
        ):
            found[node.targets[0].id] = ast.unparse(node.value.args[0]).split(".")[-1]
    return found


def _field_flag(
    index: SourceIndex,
    options: list[str],
    dest: str,
    annotation: ast.expr | None,
    bool_optional: bool,
    config_field: str,
) -> Flag:
    """A flag built by vLLM's get_kwargs() from one dataclass field, as get_kwargs types it."""
    flag = Flag(options=options, dest=dest, config_field=config_field)
    if annotation is None:
        return flag
    is_bool = annotation_has(annotation, "bool")
    optional_value = is_bool and annotation_has(annotation, "str")  # `bool | str | None`: `--x` or `--x V`
    if is_bool and not optional_value:
        flag.boolean = True
        flag.takes_value = False
        if not bool_optional:
            flag.takes_value = True  # before BooleanOptionalAction, bools were parsed from a value
            flag.boolean = False
    elif not annotation_has(annotation, "str") and not annotation_has(annotation, "dict"):
        values = literal_values(index, annotation)
        if values:
            flag.choices = values
    return flag


def _call_kw(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _explicit_flag(
    index: SourceIndex, call: ast.Call, options: list[str], kwarg_sources: dict[str, str], bool_optional: bool
) -> Flag:
    dest = options[0].lstrip("-").replace("-", "_")
    for opt in options:
        if opt.startswith("--"):
            dest = opt[2:].replace("-", "_")
            break
    flag: Flag | None = None
    spreads = [kw.value for kw in call.keywords if kw.arg is None]
    # `**{**cache_kwargs["x"], "default": None}` spreads the field's kwargs and overrides a few
    spreads += [
        v
        for s in spreads
        if isinstance(s, ast.Dict)
        for k, v in zip(s.keys, s.values, strict=True)
        if k is None
    ]
    for spread in spreads:
        if isinstance(spread, ast.Subscript) and isinstance(spread.value, ast.Name):
            cls = kwarg_sources.get(spread.value.id)
            key = _const_str(spread.slice)
            if cls and key:
                flag = _field_flag(
                    index, options, dest, index.fields(cls).get(key), bool_optional, f"{cls}.{key}"
                )
    if flag is None:
        flag = Flag(options=options, dest=dest)
    if (dest_kw := _call_kw(call, "dest")) is not None and _const_str(dest_kw):
        flag.dest = _const_str(dest_kw) or flag.dest
    action = _call_kw(call, "action")
    if action is not None:
        text = ast.unparse(action)
        if "BooleanOptionalAction" in text or "EnableDisableAction" in text:
            flag.boolean, flag.takes_value = True, False
        elif text.strip("'\"") in ("store_true", "store_false", "store_const", "count", "help", "version"):
            flag.boolean, flag.takes_value = False, False
    choices = _call_kw(call, "choices")
    if isinstance(choices, (ast.List, ast.Tuple, ast.Set)):
        consts = [_const_str(e) for e in choices.elts]
        if consts and all(c is not None for c in consts):
            flag.choices = [c for c in consts if c is not None]
    deprecated = _call_kw(call, "deprecated")
    if isinstance(deprecated, ast.Constant) and deprecated.value is True:
        flag.deprecated = True
    return flag


def _add_argument_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            yield node


def _frontend_class_flags(index: SourceIndex, module: Module, bool_optional: bool) -> list[Flag]:
    """Frontend dataclasses whose fields all become `--field-name` (FrontendArgs.add_cli_args loop)."""
    flags: list[Flag] = []
    if "frontend_kwargs.items()" not in module.text:
        return flags
    extra = _extra_short_flags(module)
    for node in module.tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in ("FrontendArgs",):
            continue
        for name, annotation in index.fields(node.name).items():
            options = [*extra.get(name, []), "--" + name.replace("_", "-")]
            flags.append(_field_flag(index, options, name, annotation, bool_optional, f"{node.name}.{name}"))
    return flags


def _extra_short_flags(module: Module) -> dict[str, list[str]]:
    """`frontend_kwargs["x"]["flags"] = ["-y"]` in _customize_cli_kwargs: extra option strings per field."""
    extra: dict[str, list[str]] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if (
                isinstance(target, ast.Subscript)
                and _const_str(target.slice) == "flags"
                and isinstance(target.value, ast.Subscript)
                and (name := _const_str(target.value.slice))
                and isinstance(node.value, (ast.List, ast.Tuple))
            ):
                extra[name] = [c for e in node.value.elts if (c := _const_str(e))]
    return extra


def extract_flags(index: SourceIndex) -> dict[str, Flag]:
    bool_optional = _get_kwargs_uses_boolean_optional(index)
    enable_disable = _has_enable_disable_action(index)
    flags: list[Flag] = []
    modules = [m for rel in ENGINE_FILES if (m := index.load(rel))]
    modules += [m for pattern in FRONTEND_GLOBS for m in index.load_glob(pattern)]
    for module in modules:
        for func in ast.walk(module.tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            sources = _kwargs_sources(func)
            for call in _add_argument_calls(func):
                options = [c for a in call.args if (c := _const_str(a)) and c.startswith("-")]
                if options:
                    flags.append(_explicit_flag(index, call, options, sources, bool_optional))
        flags.extend(_frontend_class_flags(index, module, bool_optional))
    catalog: dict[str, Flag] = {}
    for flag in flags:
        if flag.boolean:
            flag.negations = ["--no-" + o[2:] for o in flag.options if o.startswith("--")]
            if enable_disable:
                for o in flag.options:
                    for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                        if o.startswith(prefix):
                            flag.negations.append(inverse + o[len(prefix) :])
        for option in flag.options:
            catalog.setdefault(option, flag)
    return catalog


# ------------------------------------------------------------------------------ values inside the JSON flags


def class_field_values(index: SourceIndex, class_name: str, field_name: str) -> list[str]:
    return literal_values(index, index.fields(class_name).get(field_name))


def enum_members(index: SourceIndex, class_name: str) -> list[str]:
    node = index.class_def(class_name)
    if node is None:
        return []
    return [
        stmt.targets[0].id
        for stmt in node.body
        if isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id.isupper()
    ]


def registered_names(index: SourceIndex, globs: Iterable[str], dict_hint: str) -> list[str]:
    """Parser names: `@Manager.register_module("x")` / `(["x", "y"])` / `(name="x")` decorators, plus the
    lazily registered `{name: (module, class)}` tables of newer releases."""
    names: list[str] = []
    for pattern in globs:
        for module in index.load_glob(pattern):
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("register_module"):
                    for arg in [
                        *node.args,
                        *(kw.value for kw in node.keywords if kw.arg in ("name", "names")),
                    ]:
                        if (text := _const_str(arg)) is not None:
                            names.append(text)
                        elif isinstance(arg, (ast.List, ast.Tuple)):
                            names.extend(c for e in arg.elts if (c := _const_str(e)))
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and dict_hint in node.targets[0].id
                    and isinstance(node.value, ast.Dict)
                ):
                    names.extend(k for key in node.value.keys if key is not None and (k := _const_str(key)))
    return sorted(set(names))


OFFLOAD_GLOBS = (
    "vllm/v1/kv_offload/**/*.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/**/*.py",
)


def offloading_keys(index: SourceIndex) -> dict[str, object]:
    """Keys read from the OffloadingConnector's kv_connector_extra_config, and the `fs` tier's arguments."""
    connector = any(
        "class OffloadingConnector" in m.text
        for pattern in OFFLOAD_GLOBS[1:]
        for m in index.load_glob(pattern)
    )
    keys: set[str] = set()
    for pattern in OFFLOAD_GLOBS:
        for module in index.load_glob(pattern):
            for node in ast.walk(module.tree):
                target: ast.expr | None = None
                key: str | None = None
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "pop", "setdefault")
                    and node.args
                ):
                    target, key = node.func.value, _const_str(node.args[0])
                elif isinstance(node, ast.Subscript):
                    target, key = node.value, _const_str(node.slice)
                if target is not None and key and "extra_config" in ast.unparse(target):
                    keys.add(key)
    fs_args: list[str] = []
    fs_cls = index.class_def("FileSystemTierManager")
    if fs_cls is None:
        index.load_glob("vllm/v1/kv_offload/tiering/fs/*.py")
        fs_cls = index.class_def("FileSystemTierManager")
    if fs_cls is not None:
        for stmt in fs_cls.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
                skip = {"self", "offloading_spec", "primary_kv_view", "tier_type"}
                fs_args = [a.arg for a in [*stmt.args.args, *stmt.args.kwonlyargs] if a.arg not in skip]
    return {"connector": connector, "extra_config_keys": sorted(keys), "fs_tier_args": fs_args}


def extract_release(version: str, root: Path) -> dict[str, object]:
    index = SourceIndex(root)
    for pattern in CONFIG_GLOBS:
        index.load_glob(pattern)
    flags = extract_flags(index)
    spec_methods = class_field_values(index, "SpeculativeConfig", "method")
    mtp = literal_values(index, ast.Name(id="MTPModelTypes"))
    kv_dtypes = class_field_values(index, "CacheConfig", "cache_dtype")
    if not kv_dtypes and "--kv-cache-dtype" in flags:
        kv_dtypes = list(flags["--kv-cache-dtype"].choices or [])
    speculative_keys = list(index.fields("SpeculativeConfig"))
    return {
        "flags": {
            option: {
                "dest": f.dest,
                "takes_value": f.takes_value,
                "boolean": f.boolean,
                "choices": f.choices,
                "negations": f.negations,
                "aliases": [o for o in f.options if o != option],
                "config_field": f.config_field,
                "deprecated": f.deprecated,
            }
            for option, f in sorted(flags.items())
        },
        "values": {
            "kv_cache_dtype": kv_dtypes,
            "speculative_method": spec_methods,
            "speculative_mtp_model_types": mtp,
            "cudagraph_mode": enum_members(index, "CUDAGraphMode"),
            "reasoning_parser": registered_names(
                index,
                ("vllm/reasoning/**/*.py", "vllm/entrypoints/openai/reasoning_parsers/**/*.py"),
                "REASONING_PARSERS",
            ),
            "tool_call_parser": registered_names(
                index,
                ("vllm/tool_parsers/**/*.py", "vllm/entrypoints/openai/tool_parsers/**/*.py"),
                "TOOL_PARSERS",
            ),
            "offloading_eviction_policy": _eviction_policies(index),
        },
        "json_keys": {
            "speculative_config": speculative_keys,
            "compilation_config": list(index.fields("CompilationConfig")),
            "kv_transfer_config": list(index.fields("KVTransferConfig")),
        },
        "offloading": offloading_keys(index),
    }


def _eviction_policies(index: SourceIndex) -> list[str]:
    """Names the offloading factory maps to a cache policy (`"lru"`, `"arc"`...)."""
    names: set[str] = set()
    for pattern in OFFLOAD_GLOBS:
        for module in index.load_glob(pattern):
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Dict) and node.keys and all(_const_str(k) for k in node.keys if k):
                    values = [ast.unparse(v) for v in node.values]
                    if any("Policy" in v or "Manager" in v for v in values):
                        keys = [_const_str(k) for k in node.keys if k]
                        if {"lru"} & set(keys):
                            names.update(k for k in keys if k)
                if (
                    isinstance(node, ast.Call)
                    and ast.unparse(node.func).endswith("register_cache_policy")
                    and node.args
                    and (text := _const_str(node.args[0]))
                ):
                    names.add(text)
                if isinstance(node, ast.Compare) and "eviction_policy" in ast.unparse(node.left):
                    for comp in node.comparators:
                        if (text := _const_str(comp)) is not None:
                            names.add(text)
    return sorted(names)


# -------------------------------------------------------------------------------------------------- main


class Interner:
    """One table of distinct JSON values; a release names its flag entries and value lists by index, so
    forty releases that share most of their flags cost little more than one (issue 34: the catalog is parsed
    on every ansible run)."""

    def __init__(self) -> None:
        self.items: list[object] = []
        self._ids: dict[str, int] = {}

    def add(self, value: object) -> int:
        key = json.dumps(value, sort_keys=True)
        if key not in self._ids:
            self._ids[key] = len(self.items)
            self.items.append(value)
        return self._ids[key]


def compact(releases: dict[str, dict[str, object]]) -> tuple[list[object], dict[str, object]]:
    """Each release's flags as indexes into a shared table of `{"option": ..., entry...}` dicts, and its
    value lists (values, json_keys, offloading lists) as indexes into the same table."""
    table = Interner()
    packed: dict[str, object] = {}
    for version, data in releases.items():
        flag_ids = [table.add({"option": opt, **entry}) for opt, entry in data["flags"].items()]  # type: ignore[union-attr]
        packed[version] = {
            "flags": flag_ids,
            "values": {k: table.add(v) for k, v in data["values"].items()},  # type: ignore[union-attr]
            "json_keys": {k: table.add(v) for k, v in data["json_keys"].items()},  # type: ignore[union-attr]
            "offloading": table.add(data["offloading"]),
        }
    return table.items, packed


def build_catalog(
    versions: Iterable[str], cache: Path, pip: str, index: list[str], as_of: str
) -> dict[str, object]:
    releases = {}
    for version in versions:
        releases[version] = extract_release(version, fetch(version, cache, pip))
    shared, packed = compact(releases)
    return {
        "generated_by": "scripts/gen_flag_catalog.py",
        "source": "vllm wheels from PyPI (pip download vllm==X --no-deps), read with ast",
        "format": 2,
        "package_index": {
            "as_of": as_of,
            "command": "pip index versions vllm",
            "versions": index,
        },
        "shared": shared,
        "releases": packed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="wheel/source cache (outside the repo)"
    )
    parser.add_argument(
        "--versions", nargs="+", help="only these releases (default: every release the package index lists)"
    )
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="'-' for stdout")
    parser.add_argument("--pip", default=str(Path(sys.executable).with_name("pip")))
    parser.add_argument(
        "--index-from",
        type=Path,
        help="reuse the package index list recorded in this catalog (regenerate it byte for byte) instead of "
        "asking the index now",
    )
    args = parser.parse_args(argv)
    if args.index_from:
        recorded = json.loads(args.index_from.read_text(encoding="utf-8"))["package_index"]
        index, as_of = recorded["versions"], recorded["as_of"]
    else:
        index, as_of = index_versions(args.pip), time.strftime("%Y-%m-%d", time.gmtime())
    args.versions = args.versions or covered_versions(index)
    catalog = build_catalog(args.versions, args.cache, args.pip, index, as_of)
    # one line per shared entry and per release: diffs of a regenerated catalog stay readable
    text = _dump(catalog)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}: {', '.join(args.versions)}")
    return 0


def _dump(catalog: dict[str, object]) -> str:
    head = {k: v for k, v in catalog.items() if k not in ("shared", "releases")}
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    shared = catalog["shared"]
    lines.append(' "shared": [')
    lines += [f"  {json.dumps(item, separators=(',', ':'))}," for item in shared]  # type: ignore[union-attr]
    lines[-1] = lines[-1].rstrip(",")
    lines.append(" ],")
    lines.append(' "releases": {')
    releases = catalog["releases"]
    lines += [
        f"  {json.dumps(v)}: {json.dumps(d, separators=(',', ':'))},"
        for v, d in releases.items()  # type: ignore[union-attr]
    ]
    lines[-1] = lines[-1].rstrip(",")
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
