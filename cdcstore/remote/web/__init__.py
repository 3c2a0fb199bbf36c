"""The read-only web view under /ui/ (docs/web.md): routes (view.py), what the pages show,
computed through the public API (data.py), and the HTML (pages.py). Imports server/ and
the gateway's file bodies."""
