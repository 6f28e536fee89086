"""The scheduler of `serve`: the leader's lease, and which job runs when on its holder."""
