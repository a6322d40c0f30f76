"""Remote measurement through TVM's RPC tracker: ``tracker`` (protocol client, device queues, runner
checks) and ``processes`` (the tracker and device servers Kiln runs)."""
