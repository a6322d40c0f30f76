"""Kiln's tuning core: import a model, extract tasks, tune them with MetaSchedule, compile an artifact.

Importing ``tuner`` does not import TVM; the modules that need it do so through the gate, ``kiln_tvm``.
"""

__version__ = "0.1.0"
