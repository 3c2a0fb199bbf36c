"""The native protocol's server side (docs/protocol.md): `Server`, the request context every
route group shares (app.py); the route groups for refs (refs.py), chunks and packs (packs.py),
manifests and trees (metadata.py, batches.py), jobs (staging.py) and the lifecycle (admin.py);
who a request is by (auth.py, tokens.py) and the bounds on what a client can make it hold
(limits.py). Imports no other room of the remote floor: the gateway and the web view build
on it, and remote/serve.py puts them together."""
