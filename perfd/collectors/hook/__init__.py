"""Receiver for the perfd step hook (perfd.hook.StepHook): Unix datagrams -> StepRecords.

See README.md in this folder for the wire format, configuration and limits.
"""

from perfd.collectors.hook.collector import HookCollector
from perfd.collectors.hook.config import HookConfig
from perfd.collectors.hook.peers import HookPeer

__all__ = ["HookCollector", "HookConfig", "HookPeer"]
