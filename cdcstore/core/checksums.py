"""The checksums S3 clients may send with a write that Python's standard library lacks: CRC-32C
(Castagnoli) and CRC-64/NVME, in C (`_crc.c`: slice-by-8, the GIL released from 64 KiB). Each
takes the data and a running value to continue, as `zlib.crc32` does. Check values for b"123456789":
crc32c 0xE3069283, crc64nvme 0xAE8B14860A799888 (pinned in tests/test_gateway_write.py)."""
from ._crc import crc32c, crc64nvme

__all__ = ["crc32c", "crc64nvme"]
