#!/usr/bin/python
"""Preflight's reachability check of a multi-host instance's master port, before vLLM listens there: a
short-lived listener on rank 0 that the other ranks connect to (a route lookup alone would miss a firewall
that drops the port; a connection test alone finds nothing listening before the first deploy)."""

from __future__ import annotations

import errno
import socket
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: vllm_fleet_master_listen
short_description: Listen on a multi-host instance's master port for a while, and name who connected
description:
  - Binds O(port) on every address of rank 0 and accepts connections until O(expect) different addresses
    have connected or O(timeout) seconds have passed; each connection is closed at once. Meant to run with
    C(async) and C(poll) 0 while the other ranks connect with M(ansible.builtin.wait_for).
  - Addresses, not connections, are counted. A rank's own vLLM or its watch of rank 0 may connect too (a
    rank restarted while rank 0 is down probes the master port every few seconds), and the listener must
    not end before the other ranks have had their turn. Such a connection proves the way from its host as
    well as the rank's own test would. RV(peers) names every address that connected, and preflight accepts
    a rank whose address is among them.
  - When the port is already in use (the instance's own master, a converged host), it listens to nothing and
    reports RV(in_use); the other ranks then test their connection against the running master.
  - Changes nothing on the host.
version_added: "0.1.0"
options:
  port:
    description: The master port (vllm_service_master_port).
    type: int
    required: true
  expect:
    description: How many different addresses end the wait (the other ranks).
    type: int
    required: true
  timeout:
    description: Seconds to listen at most.
    type: int
    default: 60
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - vllm-fleet
"""

EXAMPLES = r"""
- name: Listen on the master port while the other ranks connect
  vllm_fleet.serving.vllm_fleet_master_listen:
    port: 29501
    expect: 1
  async: 90
  poll: 0
"""

RETURN = r"""
in_use:
  description: The port was already bound (the running instance's master); nothing was listened to.
  type: bool
  returned: always
peers:
  description: The different addresses that connected, in the order of their first connection.
  type: list
  elements: str
  returned: always
"""


def listen(port: int, expect: int, timeout: int) -> tuple[bool, list[str]]:
    """(in use, the different addresses that connected, first connection first)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True, []
            raise
        server.listen(16)
        peers: list[str] = []
        deadline = time.monotonic() + timeout
        while len(peers) < expect and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                connection, address = server.accept()
            except TimeoutError:
                break
            connection.close()
            if str(address[0]) not in peers:
                peers.append(str(address[0]))
        return False, peers
    finally:
        server.close()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "expect": {"type": "int", "required": True},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    port, expect, timeout = module.params["port"], module.params["expect"], module.params["timeout"]
    if not 0 < port < 65536:
        module.fail_json(msg=f"vllm_service_master_port: {port} is no TCP port; give e.g. 29501")
    try:
        in_use, peers = listen(port, expect, timeout)
    except OSError as exc:
        module.fail_json(msg=f"vllm_service_master_port: cannot listen on {port} ({exc}); choose a free port")
    module.exit_json(changed=False, in_use=in_use, peers=peers)


if __name__ == "__main__":
    main()
