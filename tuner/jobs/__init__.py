"""A tuning job's life: its pipeline of stages, the recorder that keeps what happened, the workers that
run jobs, and what a job leaves (manifest, artifact, failure reports)."""
