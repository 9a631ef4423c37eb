"""Deterministic simulation of the real bookie and client code (docs/design/invariants.md)."""
