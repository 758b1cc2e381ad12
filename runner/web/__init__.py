"""The web console, ``latchwork web``: server-rendered pages (Starlette and Jinja2, htmx for the
live parts, no JavaScript build step) over :class:`runner.client.Client`.

* :mod:`~runner.web.app`: the pages and their live fragments;
* :mod:`~runner.web.actions`: the actions, routed only with ``--allow-actions``;
* :mod:`~runner.web.security`: credentials, the bind check and CSRF;
* :mod:`~runner.web.views`: the query box, the attempt timeline, ages (pure).

Its dependencies are the ``web`` extra (``pip install 'latchwork[web]'``); templates and static
files (htmx, vendored: no network at run time) live in the package.
"""
