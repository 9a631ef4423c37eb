"""Helpers the tests share: clusters, processes, disks, certificates, waiting."""
