"""Load, bounded: 64 streaming and range readers against one real `cdcstore serve` (bench/load.py)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_64_readers_see_no_error_no_5xx_and_every_429_is_waited_out(tmp_path):
    """2 processes x 32 readers for 8 s, every one on the token limited to the repo (each pack range
    is built masked in one of only 2 heavy slots, so the server must turn requests away or queue
    them): no client error or wrong byte, no 5xx, the server's RSS bounded, every 429 retried."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "load.py"), "--processes", "2", "--threads", "32",
         "--seconds", "8", "--files", "4", "--rows-per-group", "4096", "--scoped", "all", "--max-heavy", "2",
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=150, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    assert fig["readers_reported"] == 64 and fig["hung_threads"] == 0, fig
    assert fig["client_errors"] == 0, fig["error_samples"]
    assert fig["rows"] > 0 and fig["range_reads"] > 0, fig
    assert fig["server_5xx"] == 0 and fig["server_internal_error_lines"] == 0, fig["statuses"]
    assert fig["server_alive_after"]
    assert fig["server_429"] <= fig["client_busy_retries"], fig  # each 429 was retried
    assert fig["server_rss"]["hwm_mb"] < 400, fig["server_rss"]
