"""Action plugin: `vllm-fleet lab up` on the controller, its progress shown in the play as it happens.

Thin by design: it runs the CLI (`lab up --name NAME --host H ... --json`) and relays each line the CLI
prints on stderr (one per stage, and the cache builds' progress: vllm_fleet.lab.progress, at most one line per
10 s a step) to the play's output while the command runs; the CLI's JSON result comes back as `stdout`, as
the `ansible.builtin.command` task it replaces returned it. A first run builds the lab caches (debootstrap,
the vLLM wheelhouse) for minutes: without this the play printed nothing for about 8 minutes.

A lab that is up already with these hosts is answered in this process (`vllm_fleet.lab.run.reuse_if_up`,
the check `lab up` makes first): a re-run of site.yml pays no CLI start for it (issue 21).
"""

from __future__ import annotations

import json
import subprocess
import threading

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from vllm_fleet.errors import FleetInputError
from vllm_fleet.lab.run import reuse_if_up

ARGUMENT_SPEC = {
    "cli": {"type": "str", "required": True},
    "name": {"type": "str", "required": True},
    "hosts": {"type": "list", "elements": "str", "required": True},
    "timeout": {"type": "int", "default": 3600},
    "preinstalled_vllm": {"type": "bool", "default": False},
}
# A worker's display calls go through Ansible's result queue to the terminal as they happen.
display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        _, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            reused = reuse_if_up(args["name"], args["hosts"])
        except (FleetInputError, OSError):
            reused = None  # a bad name or an unreadable state: `lab up` says what is wrong
        if reused is not None:
            result.update(cmd=[], rc=0, stdout=json.dumps(reused), stderr="", changed=False)
            return result
        argv = [args["cli"], "lab", "up", "--name", args["name"], "--json"]
        argv += [f"--host={host}" for host in args["hosts"]]
        if args["preinstalled_vllm"]:
            argv.append("--preinstalled-vllm")
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
            )
        except OSError as exc:
            raise AnsibleActionFail(
                f"vllm_fleet_lab_up: cannot run {argv[0]}: {exc}; run scripts/bootstrap"
            ) from exc
        stderr: list[str] = []
        stdout_chunks: list[str] = []

        def relay() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                stderr.append(line.rstrip("\n"))
                display.display(f"  {line.rstrip()}")

        def collect() -> None:
            assert proc.stdout is not None
            stdout_chunks.append(proc.stdout.read())

        # one reader per pipe: communicate() would read stderr too and split its lines with the relay
        readers = [threading.Thread(target=f, daemon=True) for f in (relay, collect)]
        for reader in readers:
            reader.start()
        try:
            proc.wait(timeout=args["timeout"])
        except subprocess.TimeoutExpired:
            proc.terminate()  # `lab up` tears down what it created on SIGTERM
            proc.wait(timeout=120)
            raise AnsibleActionFail(
                f"vllm_fleet_lab_up: lab {args['name']}: `lab up` ran past timeout={args['timeout']} s "
                "and was stopped; see the lines above for the step it was in"
            ) from None
        finally:
            for reader in readers:
                reader.join(timeout=10)
        stdout = "".join(stdout_chunks)
        result.update(cmd=argv, rc=proc.returncode, stdout=stdout, stderr="\n".join(stderr))
        if proc.returncode != 0:
            result.update(failed=True, msg=f"lab {args['name']}: `lab up` failed: {' '.join(stderr[-5:])}")
            return result
        try:
            result["changed"] = bool(json.loads(stdout)["changed"])
        except (ValueError, KeyError) as exc:
            raise AnsibleActionFail(
                f"vllm_fleet_lab_up: `lab up --json` printed no result: {stdout[-500:]!r}"
            ) from exc
        return result
