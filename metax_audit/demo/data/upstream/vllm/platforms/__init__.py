# Demo stand-in for the platform object that backends ask about the device.
from __future__ import annotations


class _Platform:
    device_name = "demo"

    def get_device_capability(self) -> tuple[int, int]:
        return (9, 0)

    def is_device_capability(self, capability: int) -> bool:
        major, minor = self.get_device_capability()
        return major * 10 + minor == capability

    def has_device_capability(self, capability: int) -> bool:
        major, minor = self.get_device_capability()
        return major * 10 + minor >= capability


current_platform = _Platform()
