"""Cluster mode: membership of nodes, leases on pchannels and who owns which pchannel."""
