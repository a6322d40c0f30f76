"""Kiln's plug-ins into MetaSchedule's interfaces: the builder (a persistent pool), the runners (local,
measured on an idle CPU; RPC, with every wait bounded), the database (Kiln's SQL store) and the measure
callback (progress and cancellation)."""
