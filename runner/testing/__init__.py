"""The runner's test harness: the pytest plugin (``pytest_plugins = ["runner.testing.plugin"]``,
which also loads coord's and messaging's fixtures), :mod:`runner.testing.cluster` (node processes
of one cluster driven through the node API) and the participants ``chaosnode`` and
``storeclaimer``. Servers and fault injectors live with the layer that owns them:
:mod:`coord.testing` and :mod:`messaging.testing`."""
