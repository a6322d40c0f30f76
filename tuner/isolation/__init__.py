"""Processes kept apart from the service and the worker: the sandbox that imports untrusted models
under limits, and the handlers that report a fatal signal."""
