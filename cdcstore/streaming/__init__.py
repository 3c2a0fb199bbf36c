"""The streaming loader (docs/streaming.md), one room of the faces: the dataset, its torch loader
and its resume points (dataset.py; public as `cdcstore.stream`); what a source file is and how
each kind is read (sources.py: Parquet row groups, TAR samples); row groups decoded once and
shared by DataLoader workers (decoded.py); the global order, its shuffle and its deal to ranks
and workers (order.py); TAR shards (shards.py) and sample decoders (decoders.py), both pure.
Imports `api`, core and the runtime, like every face."""
