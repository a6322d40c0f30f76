"""Remote measurement through TVM's RPC tracker: ``address`` (a tracker's host:port, checked without
TVM), ``tracker`` (protocol client, device queues, runner checks) and ``processes`` (the tracker and device
servers Kiln runs)."""
