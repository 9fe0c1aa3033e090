"""The shard step: collections, partitions and segments of each vchannel."""
