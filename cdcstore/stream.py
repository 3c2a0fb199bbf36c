"""`cdcstore.stream`: the public name of the streaming loader, which lives in cdcstore/streaming/
(dataset.py: `StreamingDataset`, `Loader`, `interleave`, `torch_dataset`; `TorchStreamingDataset`
is made when first asked for, so importing this module does not import torch; sources.py: the
kinds of source a dataset reads, `SampleSource` the one to subclass)."""
from .streaming.dataset import (Interleave, Loader, StreamingDataset, __getattr__, interleave,  # noqa: F401
                                resolve_rank, torch_dataset)
from .streaming.sources import KINDS, ParquetSource, SampleSource, Source, SourceFile, TarSource  # noqa: F401
