"""The tests' server starter is the package's own (`cdcstore.testing`), shared with bench/."""
from cdcstore.testing import ServerProcess, free_port, stop_process, wait_until_up  # noqa: F401
