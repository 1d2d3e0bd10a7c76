"""The gRPC edge: server, one interceptor gate, servicer (proto <-> domain, errors -> status codes), auth, ops HTTP."""
