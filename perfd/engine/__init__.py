"""perfd's distributed path on NATS JetStream (see each module)."""
