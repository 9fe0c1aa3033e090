"""Generated protobuf/gRPC modules for the v1 contract; regenerate with `make proto`."""
