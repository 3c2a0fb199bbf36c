"""CRC-32C and CRC-64/NVME (S3 checksums), in C (`_crc.c`)."""
from _typeshed import ReadableBuffer

def crc32c(data: ReadableBuffer, previous: int = 0, /) -> int:
    """CRC-32C of `data`, continuing `previous`."""

def crc64nvme(data: ReadableBuffer, previous: int = 0, /) -> int:
    """CRC-64/NVME of `data`, continuing `previous`."""
