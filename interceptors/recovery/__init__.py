"""Opening a pchannel for streaming: the chain in front of the WAL, recovery and snapshots."""
