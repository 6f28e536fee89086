"""Actions: the reactor that records them, the outbox that runs them, one module a kind."""
