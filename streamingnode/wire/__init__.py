"""The wire: protobuf codec, the error-code table and the sizing of delivery packs."""
