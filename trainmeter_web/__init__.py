"""trainmeter's dashboard: the ``web`` bus component, its JSON API and live stream, the static page, and ``tm view``.

Importing this package is cheap and imports no aiohttp; only ``trainmeter_web.server`` does, in the web process.
"""
