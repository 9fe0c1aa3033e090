"""The node: its channels, consumer groups, retention, the disk guard and process tuning."""
