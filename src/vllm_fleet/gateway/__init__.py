"""The gateway in front of the fleet's instances (HAProxy, roles/fleet_gateway) and the drain of an instance.

sets.py     instance sets (long, short, user-named) from the hosts' plans and the prompt-size routing
haproxy.py  haproxy.cfg from the sets and the gateway's settings
drain.py    the runtime API's commands and replies, and the verdict of an instance's drain
"""
