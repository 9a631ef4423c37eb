"""The PySpark data source over aiobk logs (optional extra ``spark``)."""

from aiobk.pipeline.source import AiobkDataSource, local_session, register

__all__ = ["AiobkDataSource", "local_session", "register"]
