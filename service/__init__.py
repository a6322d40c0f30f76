"""Kiln's web layer (FastAPI + dashboard). It only parses, delegates to ``tuner`` and serializes."""
