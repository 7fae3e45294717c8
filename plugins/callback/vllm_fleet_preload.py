"""Loads the collection's filter and action plugins, and with them the vllm_fleet library they call, once in
ansible-playbook's own process, so that the worker forked for each task of each host inherits them.

Without it every worker imports them again and throws them away when it exits: ansible-core finds a
collection's filter by loading every filter file of the collection (several filters share a file), so each
task that names one of this collection's filters imported the library's verify, deploy and plan modules. On a
converged 1-host re-run of site.yml that was about 40 % of the controller's CPU and 4 of 11 seconds (issue
21, benchmarks/README.md).

Then it freezes the garbage collector's view of everything loaded so far (gc.freeze, as Python's documentation
advises before fork): a collection in a worker no longer walks, and so copies page by page, the parent's
objects. On 4 lab hosts that cut the controller's CPU of a converged re-run by about a fifth."""

from __future__ import annotations

import gc
import importlib
import pkgutil

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: vllm_fleet_preload
type: aggregate
short_description: load this collection's filter and action plugins once, before any task runs
description:
  - Imports every filter and action plugin of vllm_fleet.serving, and through them the vllm_fleet library, in
    ansible-playbook's own process when the playbook starts. The worker process that runs each task is a fork
    of that process, so it finds them loaded instead of importing them for every task of every host.
  - Then freezes the garbage collector's generations (gc.freeze), so that a collection in a worker does not
    touch, and so copy, the objects it inherited.
  - Prints nothing and changes no result; a run without it is the same run, only slower on the controller.
requirements:
  - enable in ansible.cfg (callbacks_enabled = vllm_fleet.serving.vllm_fleet_preload)
"""

# ansible_collections.vllm_fleet.serving.plugins, the package this callback's own module lives in
PLUGINS_PACKAGE = __name__.rsplit(".", 2)[0]
PRELOADED_KINDS = ("filter", "action")


def preload_plugins(plugins_package: str = PLUGINS_PACKAGE) -> list[str]:
    """Import every module of the collection's filter and action packages under the names ansible-core's
    plugin loader gives them (it reuses what sys.modules holds); returns those names."""
    loaded = []
    for kind in PRELOADED_KINDS:
        package = importlib.import_module(f"{plugins_package}.{kind}")
        for module in pkgutil.iter_modules(package.__path__, prefix=f"{package.__name__}."):
            importlib.import_module(module.name)
            loaded.append(module.name)
    return loaded


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_fleet_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook) -> None:
        preload_plugins()
        # once, not before every task: measured, freezing again at each task start gained less
        gc.freeze()
