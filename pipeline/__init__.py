"""The PySpark data source over aiobk logs (optional extra ``spark``)."""

try:
    from aiobk.pipeline.source import AiobkDataSource, local_session, register
except ModuleNotFoundError as _missing:
    if (_missing.name or "").partition(".")[0] not in {"pyspark", "pyarrow"}:
        raise
    raise ModuleNotFoundError(
        f"aiobk.pipeline needs the spark extra: pip install 'aiobk[spark]' "
        f"({_missing.name} is not installed)",
        name=_missing.name,
    ) from _missing

__all__ = ["AiobkDataSource", "local_session", "register"]
