"""Offline tools on a stopped node's data: verify, salvage and compact."""
