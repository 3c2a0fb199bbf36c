"""The client of `cdcstore serve`: `RemoteStore` (store.py), a `Backend` over HTTP; the
receiver that lands range bodies in place (receiver.py); a server's refs (refs.py) and job
journals (journal.py). Imports nothing of the server, the gateway or the web view."""
