"""The ``kiln`` command line: tuning, browsing and operations commands on top of the core and the service.

It is the only package that knows both the web layer (:mod:`service`) and the core (:mod:`tuner`).
"""
