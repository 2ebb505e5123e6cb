"""``latentsift reproduce``: the paper's run end to end (``latentsift.protocol.reproduction``)."""
from __future__ import annotations

from ..protocol.reproduction import ReproduceSettings, reproduce

__all__ = ["ReproduceSettings", "reproduce"]
