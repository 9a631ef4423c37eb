"""Benchmarks: the bookie's add path against the physical floors of the same machine."""

__all__: list[str] = []
