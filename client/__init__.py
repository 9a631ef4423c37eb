"""The aiobk async client."""

from client import errors
from client.connection import BookieConnection
from client.digest import Digester
from client.net import AsyncioConnector, Connector

__all__ = ["AsyncioConnector", "BookieConnection", "Connector", "Digester", "errors"]
