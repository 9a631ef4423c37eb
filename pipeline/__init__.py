"""The PySpark data source over aiobk logs (optional extra ``spark``; API.md "Spark")."""

from aiobk.pipeline.source import AiobkDataSource, local_session, register

__all__ = ["AiobkDataSource", "local_session", "register"]
