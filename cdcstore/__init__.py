"""cdcstore: content-defined-chunking, deduplicating storage for ML datasets."""
from .api import Store, TransferResult
from .core.address import Address, parse
from .core.errors import (AccessDeniedError, CdcError, ConflictError, CorruptionError, InvalidAddressError,
                     NotAStoreError, NotFoundError, PathNotFoundError, RefExistsError, RemoteError,
                     RepoNotFoundError, RevisionNotFoundError)

__version__ = "0.1.0"
__all__ = ["Store", "TransferResult", "Address", "parse", "AccessDeniedError", "CdcError", "ConflictError",
           "CorruptionError", "InvalidAddressError", "NotAStoreError", "NotFoundError", "PathNotFoundError",
           "RefExistsError", "RemoteError", "RepoNotFoundError", "RevisionNotFoundError"]

import sys as _sys

if "webdataset" in _sys.modules:  # already imported, so free: let it open cdc:// (cdcstore/gopen.py says why)
    from . import gopen as _gopen  # noqa: F401
