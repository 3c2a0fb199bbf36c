"""The remote floor: a store served over HTTP and the client that talks to it.

Rooms (each imports only the rooms listed before it, and the layers below: storage, core,
runtime; tests/test_layers.py keeps it so):

    client/   `RemoteStore` (the client side of protocol v1: a `Backend` over HTTP), its range
              receiver, remote refs and journals. Imports no other room: a client never loads
              server code.
    server/   the native protocol's routes (refs, packs, manifests and trees, jobs, admin), the
              request context they share (`Server`), tokens, scopes and limits.
    gateway/  the S3-compatible gateway: reads, listings, writes, multipart uploads, S3 bodies and
              forms (SigV4 and aws-chunked decoding are pure formats in core/; staged multipart
              parts in storage/uploads.py). Builds on server/'s context, tokens and limits.
    web/      the read-only web view under /ui/: pages, what they show, the routes.
    serve.py  `cdcstore serve`: one process, the native routes, the web view and the gateway.

The wire format both sides speak is core/wire.py.
"""
