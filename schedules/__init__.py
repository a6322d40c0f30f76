"""Schedule spaces for Kiln: the MetaSchedule rule sets per target and the analysis they rely on.

This package sits at the bottom of Kiln's layering (service -> tuner -> schedules) and is the only place
that imports TVM's unstable module paths (see ``kiln_tvm``).
"""
