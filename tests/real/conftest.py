"""Ray in these tests: no call ever starts an instance by itself. A Ray API called after `ray.shutdown()`
(a fault test's killer thread still polling when its run ended) would otherwise auto-start one, on the
host's address and without token auth, that the next test in the process then finds running."""
import pytest

try:
    import ray._private.auto_init_hook as _auto_init
except ImportError:  # no Ray: its tests skip themselves
    _auto_init = None


@pytest.fixture(autouse=True, scope="session")
def _no_ray_auto_init():
    if _auto_init is not None:
        _auto_init.enable_auto_connect = False
    yield
