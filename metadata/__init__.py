"""Ledger metadata and the stores that hold it (etcd, memory)."""

from metadata.etcd_process import EtcdNotFoundError, EtcdProcess, free_port

__all__ = ["EtcdNotFoundError", "EtcdProcess", "free_port"]
