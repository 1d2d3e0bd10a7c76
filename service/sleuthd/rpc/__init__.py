"""The gRPC edge (the planned home of the server, servicer, gate and auth; today: per-encoder health)."""
