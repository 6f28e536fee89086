"""The polls: what the provider lists and details, read as facts for the tracker (when each
runs: `worker.schedule`)."""
