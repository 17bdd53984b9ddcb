"""Prometheus remote-write messages (generated from remote.proto)."""
