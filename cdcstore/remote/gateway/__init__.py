"""The S3-compatible gateway of `cdcstore serve --s3-port` (docs/gateway.md): reads and the
shared S3 forms (reads.py), listings (listing.py), writes (writes.py), multipart uploads
(multipart.py), write bodies with S3's checks (bodies.py) and request forms (forms.py). SigV4
and aws-chunked are pure formats (core/sigv4.py, core/awschunked.py); staged parts live in the
store (storage/uploads.py). Imports server/ (the request context, tokens, limits), no other room."""
