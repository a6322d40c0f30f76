"""Read-side views of what the compiler did: schedules and traces, kernels' assembly, tuning curves."""
