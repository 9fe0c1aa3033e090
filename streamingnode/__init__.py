"""streamingnode: a durable, ordered, transactional message log served over gRPC."""
