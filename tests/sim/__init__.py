"""Deterministic simulation of the real bookie and client code (RELIABILITY "The harness")."""
