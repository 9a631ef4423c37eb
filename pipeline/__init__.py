"""The PySpark data source over aiobk logs (optional extra ``spark``); built with the Log API."""

__all__: list[str] = []
