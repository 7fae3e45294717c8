"""Values that reach a host: the checks every such variable passes, and the one function every line of every
file the roles write goes through.

A variable that lands in a unit, an EnvironmentFile, limits.d, sysctl.d, fstab, a command line or a path is
checked here before any host changes: absolute paths without control characters or `..`, names by pattern.
A newline in a value would otherwise become a directive of its own (`ReadWritePaths=/data` then
`ExecStartPre=+/bin/sh -c ...`, run as root outside the sandbox), and `systemd-analyze verify` stays silent
about it. Errors name the variable, the value (masked when it is a secret) and the fix, in one string.

`directive(syntax, key, *values, variable=...)` writes one line of a file in that file's own syntax; it
refuses control characters for every syntax, so no value can add a line.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from vllm_fleet.errors import FleetInputError

MASK = "********"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# useradd's default NAME_REGEX (Debian adduser is stricter still); a trailing $ is for Samba machine accounts.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd.unit(5): unit names are letters, digits, ":", "-", "_", ".", "\"; the prefix adds no "@" (template
# units) and no "/" (the name is joined to the unit directory).
UNIT_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]*")
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@\\-]+\.(service|target|socket|mount|path|timer|device|slice|scope)")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
# A plain word of a setting: what vLLM, the kernel or systemd accept as a dtype, parser, governor or mode.
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Hugging Face repository ids: `org/name` (or `name`), letters, digits, '-', '_', '.'; no '..' anywhere.
HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
# Unquoted words of a unit line or an ExecStart word: everything else is quoted.
_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def shown(value: Any, *, secret: bool = False) -> str:
    """How a value appears in a message: its repr, or the mask for a secret (whatever its type)."""
    return MASK if secret else repr(value)


def no_control(value: Any, variable: str, *, secret: bool = False, fix: str = "") -> str:
    """The value as a string, refused when it holds a control character (newline, NUL, tab, escape...)."""
    text = str(value)
    if CONTROL.search(text):
        raise FleetInputError(
            f"{variable}: {shown(text, secret=secret)} holds a control character (newline, NUL, tab...), "
            "which would end the line it is written on; "
            f"{fix or 'give it on one line, without control characters'}"
        )
    return text


def absolute_path(
    value: Any, variable: str, *, example: str = "/var/cache/vllm-fleet", spaces: bool = True
) -> str:
    """An absolute path without control characters, `..` or `.` components, or doubled slashes; without
    whitespace at all where `spaces` is false (the unit's own directories: Documentation= and
    EnvironmentFile= take them unquoted)."""
    if not isinstance(value, str) or not value:
        raise FleetInputError(f"{variable}: {value!r} is not a path; give an absolute path, e.g. {example}")
    text = no_control(value, variable, fix=f"give an absolute path, e.g. {example}")
    parts = text.split("/")
    if not text.startswith("/") or any(p in (".", "..") for p in parts) or "//" in text:
        raise FleetInputError(
            f"{variable}: {value!r} is not a plain absolute path (it must start with '/' and hold no '.', "
            f"'..' or '//' components, which could lead outside the directory meant); give e.g. {example}"
        )
    if not spaces and re.search(r"\s", text):
        raise FleetInputError(
            f"{variable}: {value!r} holds whitespace, which the unit's settings would split; give a path "
            f"without spaces, e.g. {example}"
        )
    if text != text.strip():
        raise FleetInputError(
            f"{variable}: {value!r} starts or ends with whitespace, which systemd strips; give e.g. {example}"
        )
    return text.rstrip("/") or "/"


def matching(value: Any, variable: str, pattern: re.Pattern[str], what: str, *, example: str) -> str:
    """A name that must match `pattern` in full (a user, a unit prefix, a governor, a parser...)."""
    if isinstance(value, (dict, list, bool)) or value is None or not pattern.fullmatch(str(value)):
        raise FleetInputError(f"{variable}: {value!r} is not {what}; give e.g. {example}")
    return str(value)


def user_name(value: Any, variable: str) -> str:
    return matching(
        value,
        variable,
        USER_NAME,
        "a user or group name (lower-case letters, digits, '_' and '-', at most 32, not starting with a "
        "digit)",
        example="vllm",
    )


def env_name(value: Any, variable: str) -> str:
    return matching(
        value,
        variable,
        ENV_NAME,
        "an environment variable name (letters, digits and '_', not starting with a digit)",
        example="HF_HUB_OFFLINE",
    )


def unit_name(value: Any, variable: str) -> str:
    return matching(value, variable, UNIT_NAME, "a systemd unit name", example="network-online.target")


def listen_host(value: Any, variable: str) -> str:
    """An address or host name to bind to: an IPv4/IPv6 address or a DNS name."""
    text = str(value)
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    return matching(value, variable, HOSTNAME, "an IP address or a host name", example="127.0.0.1 or 0.0.0.0")


def is_loopback(host: str | None) -> bool:
    """Whether binding to `host` keeps the server on this machine (None and '' bind every interface)."""
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------ file lines


def _systemd_word(word: str, *, command: bool) -> str:
    """One word of a unit line (systemd.syntax(7)). `%` starts a specifier everywhere, so it is doubled; in
    command lines `$` expands variables too, so it is doubled there; words with other characters are
    double-quoted with C escapes (a newline stays `\\n` inside the quotes: the line never breaks)."""
    escaped = word.replace("%", "%%")
    if command:
        escaped = escaped.replace("$", "$$")
    if escaped and _SYSTEMD_SAFE.fullmatch(escaped):
        return escaped
    if command and escaped == ";":
        return "\\;"
    inner = "".join(_SYSTEMD_ESCAPES.get(ch, ch) for ch in escaped)
    return f'"{inner}"'


def exec_word(word: str) -> str:
    """One argv word of an ExecStart=-like line (the quoting `directive('exec', ...)` applies)."""
    return _systemd_word(str(word), command=True)


def _refuse_controls(
    values: tuple[Any, ...], key: str, variable: str, secret: bool, allow_newline: bool
) -> None:
    for value in values:
        text = str(value)
        if allow_newline:
            text = text.replace("\n", "").replace("\t", "")
        no_control(text, variable or key, secret=secret)


def directive(syntax: str, key: str, *values: Any, variable: str = "", secret: bool = False) -> str:
    """One line of a file a role writes, in that file's syntax. Every value is refused when it holds a control
    character (the line would end there); `variable` names the input the value came from.

    - `unit`: `Key=value` of a unit file, the value taken literally (User=, WorkingDirectory=, Description=):
      `%` doubled, no quoting (systemd does not unquote these settings).
    - `unit-words`: `Key=word word` of a list setting systemd unquotes (ReadWritePaths=, Environment=,
      After=).
    - `exec`: `Key=argv...` of a command line (ExecStart=): `%` and `$` doubled, words quoted; a newline or
      tab inside a word is written as `\\n` / `\\t` within quotes (the wait-for-ready script), never raw.
    - `env`: `KEY="value"` of an EnvironmentFile, `\\` and `"` escaped (systemd unquotes them).
    - `limits`, `fstab`: whitespace-separated fields (limits.conf(5), fstab(5)); a field with whitespace is
      refused (limits.d) or written with fstab's `\\040`.
    - `sysctl`: `key = value` (sysctl.d(5)).
    """
    _refuse_controls((key,), key, variable, False, False)
    _refuse_controls(values, key, variable, secret, syntax == "exec")
    words = [str(v) for v in values]
    if syntax == "unit":
        return f"{key}={' '.join(words).replace('%', '%%')}"
    if syntax == "unit-words":
        return f"{key}={' '.join(_systemd_word(w, command=False) for w in words)}"
    if syntax == "exec":
        return f"{key}={' '.join(_systemd_word(w, command=True) for w in words)}"
    if syntax == "env":
        if not ENV_NAME.fullmatch(key):
            raise FleetInputError(
                f"{variable or key}: {key!r} is not an environment variable name; use letters, digits and "
                "'_', not starting with a digit"
            )
        value = "".join(words).replace("\\", "\\\\").replace('"', '\\"')
        return f'{key}="{value}"'
    if syntax == "limits":
        fields = [key, *words]
        bad = [f for f in fields if not f or re.search(r"\s", f)]
        if bad:
            raise FleetInputError(
                f"{variable or key}: {bad[0]!r} holds whitespace or is empty; limits.d fields are single "
                "words: give a plain user name"
            )
        return " ".join(fields)
    if syntax == "fstab":
        return " ".join(f.replace("\\", "\\134").replace(" ", "\\040") for f in [key, *words])
    if syntax == "sysctl":
        return f"{key} = {' '.join(words)}"
    raise ValueError(f"directive: unknown syntax {syntax!r}")
