"""vllm-fleet: every decision the Ansible toolkit makes, as pure Python (no Ansible imports here)."""

__version__ = "0.1.0"
